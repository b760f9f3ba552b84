"""Sweeps: many decode methods on one data split, each timed beside the target alone.

    settings  SweepSettings, BildSweep, BlockwiseSweep, recorded_config
    sweeps    run_sweep, bild_points, blockwise_points, lm_split
    run       Point, Split, Timing, load_split, run_points, measure_point, lattice_cost_ms
    report    points_markdown, pick, table1_markdown, plot, write_outputs

`specdec sweep-bild` (BiLD's threshold grid, Table 1 layout, Pareto plot) and
`specdec sweep-blockwise` (Kim et al.'s Table 4) are its command-line front ends: they
parse the flags into a `BildSweep` / `BlockwiseSweep` and call `run_sweep`.
"""

from specdec_jax_lab.sweep import report as report
from specdec_jax_lab.sweep.report import pick, points_markdown, table1_markdown, write_outputs
from specdec_jax_lab.sweep.run import (
  Point,
  Split,
  Timing,
  lattice_cost_ms,
  load_split,
  measure_point,
  run_points,
)
from specdec_jax_lab.sweep.settings import BildSweep, BlockwiseSweep, SweepSettings
from specdec_jax_lab.sweep.sweeps import run_sweep

__all__ = ["BildSweep", "BlockwiseSweep", "Point", "Split", "SweepSettings", "Timing",
           "lattice_cost_ms", "load_split", "measure_point", "pick", "points_markdown",
           "run_points", "run_sweep", "table1_markdown", "write_outputs"]
