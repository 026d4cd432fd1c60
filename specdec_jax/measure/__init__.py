"""Measuring and reporting: the main job's rows (`evaluation`) over a test set decoded
by each method in turn (`translation`), model calls timed as the decode
loop sees them (`timing`, `profiling`, `xla_cpu`), and their tables, files and figures
(`tables`, `results_io`, `traces`). The engine never imports these."""
