"""Train the bundled De->En demo pair (thin wrapper over specdec_jax.tools.demo).

    python scripts/train_demo.py --workdir runs/demo [--stages data,target,drafter,aligned,distilled,bundle]
"""

import argparse

from specdec_jax.tools import demo

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--recipe", default="configs/demo/train.json")
parser.add_argument("--workdir", default="runs/demo")
parser.add_argument("--stages", default="all")
args = parser.parse_args()
stages = "all" if args.stages == "all" else args.stages.split(",")
demo.run_pipeline(args.recipe, args.workdir, stages)
