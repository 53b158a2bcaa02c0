from vllm_glassbox.cli import main

raise SystemExit(main())
