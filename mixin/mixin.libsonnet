// glassbox as a monitoring mixin: its recording rules, alerts and Grafana dashboards for
// kube-prometheus, grafana-operator or any jsonnet pipeline (docs/fleet.md shows both).
//
// Built from the repository's sources only — the rule files of alerts/ and the dashboards
// of dashboards/generated/, copied into generated/ by scripts/sync-mixin.py — so the
// mixin and the shipped files cannot differ: tests/mixin/test_mixin.py renders this file
// with jsonnet and compares it with them.
//
//   local glassbox = (import 'mixin.libsonnet') + { _config+:: { aggregationLabels: ['cluster'] } };
//   glassbox.prometheusRules.groups + glassbox.prometheusAlerts.groups
local sources = import 'generated/sources.libsonnet';

local isWordChar(c) =
  (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
local isSpace(c) = c == ' ' || c == '\t' || c == '\n' || c == '\r';

// The index of the last character before `i` that is not a space (-1 if none).
local lastNonSpace(s, i) =
  if i <= 0 then -1
  else if isSpace(s[i - 1]) then lastNonSpace(s, i - 1)
  else i - 1;

// Whether the '(' at `i` opens a grouping: `by (` or `on (` as whole words, as the pattern
// \b(by|on)\s*\( of `glassbox rules` and the chart's template matches it.
local opensGrouping(s, i) =
  local j = lastNonSpace(s, i);
  j >= 1
  && std.member(['by', 'on'], std.substr(s, j - 1, 2))
  && (j < 2 || !isWordChar(s[j - 2]));

// `expr` with `labels` first in every `by (...)` and `on (...)`.
local withAggregationLabels(expr, labels) =
  if labels == [] then expr
  else
    local first = std.join(', ', labels) + ', ';
    std.join('', [
      expr[i] + (if expr[i] == '(' && opensGrouping(expr, i) then first else '')
      for i in std.range(0, std.length(expr) - 1)
    ]);

local onlyRecords(group) = std.length([r for r in group.rules if !std.objectHas(r, 'record')]) == 0;

{
  _config+:: {
    // Labels every recording rule and alert keeps besides namespace, job (and instance)
    // and model_name, e.g. ['cluster'] where several clusters' series meet (Thanos,
    // Mimir, a federating Prometheus): put first in every `by (...)` and `on (...)`, as
    // `glassbox rules --aggregation-labels` and the chart's
    // prometheusRule.additionalAggregationLabels do.
    aggregationLabels: [],
    // The scrape jobs of the glassbox exporters (GlassboxExporterAbsent); the chart names
    // them so.
    glassboxExporterSelector: 'job=~".*glassbox.*"',
    // 'native' where Prometheus keeps vLLM's histograms as native ones
    // (convert_classic_histograms_to_nhcb): the rules read them with histogram_count,
    // histogram_sum and histogram_fraction, as `glassbox rules --histograms native` writes
    // them; 'classic' reads their _bucket, _sum and _count series.
    histograms: 'classic',
  },

  local config = self._config,
  local adapted(group) = group {
    rules: [
      rule {
        expr: std.strReplace(
          withAggregationLabels(rule.expr, config.aggregationLabels),
          'job=~".*glassbox.*"',
          config.glassboxExporterSelector,
        ),
      }
      for rule in group.rules
    ],
  },
  local ruleFiles =
    if config.histograms == 'native' then sources.nativeRuleFiles
    else if config.histograms == 'classic' then sources.ruleFiles
    else error "_config.histograms: 'classic' or 'native', not " + config.histograms,
  local groups = std.flattenArrays([
    ruleFiles[name].groups
    for name in std.objectFields(ruleFiles)
  ]),

  // Groups that only record; every other group (alerts, or alerts with records) in
  // prometheusAlerts, whole: a group's rules run in order, so a group is never split.
  prometheusRules+:: {
    groups+: [adapted(g) for g in groups if onlyRecords(g)],
  },
  prometheusAlerts+:: {
    groups+: [adapted(g) for g in groups if !onlyRecords(g)],
  },
  // The dashboards as generated, by file name (each has a cluster variable already).
  grafanaDashboards+:: sources.dashboards,
}
