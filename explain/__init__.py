"""`glassbox explain`: a worded diagnosis of a running server, with the numbers behind it."""
