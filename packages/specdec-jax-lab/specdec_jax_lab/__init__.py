"""specdec-jax-lab: the research lab around specdec-jax, on its public API.

    specdec bench --target config:t5_1_1_small --drafter config:t5_1_1_tiny_drafter --out bench/
    specdec train --recipe configs/demo/train.json --workdir runs/demo
    specdec eval --model demo-de-en/target --data runs/demo/data --drafter demo-de-en/drafter
    specdec sweep-bild --data runs/demo/data --small aligned=demo-de-en/drafter --out DIR
    specdec results --only theory         # python -m specdec_jax_lab.results

Modules: `bench` (timing methods side by side), `sweep` (BiLD and blockwise grids),
`results` (the tables under the lab's results/ and README's headline), `hf_compare` and
`t5x_bench` (against Hugging Face and T5X), `evaluation` (BLEU, quality), `training`,
`data`, `demo` and `lm_demo` (the demo pairs' pipelines), `projection` (accelerator
projections), `commands` (the `specdec` subcommands this distribution adds, through the
entry-point group `specdec_jax.commands`).

The lab imports specdec-jax only through its public API: `import specdec_jax as sd` and
the public modules listed in docs/api/index.md (tests/unit/test_layers.py checks it).
"""
