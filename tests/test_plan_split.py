"""`specdec plan` says when the mesh's model axis splits nothing (issue 38): a 3-way model
axis divides none of the tiny T5's sharded dimensions, so each device holds every
parameter, and the plan must not print "split by the rules"."""

from specdec_jax import plan as plan_lib
from specdec_jax.cli import main
from specdec_jax.config import get_config


def _plan(model: int, name: str = "t5_1_1_tiny") -> plan_lib.MemoryPlan:
  settings = plan_lib.PlanSettings(max_input_len=16, max_new_tokens=8,
                                   mesh={"data": 1, "model": model})
  return plan_lib.memory_plan(get_config(name), None, 2, settings)


def test_the_plan_knows_whether_the_model_axis_splits_the_target():
  assert _plan(1).target_split == "one device"
  three, two = _plan(3), _plan(2)
  assert three.target_split == "replicated" and three.target_params == three.target_params_whole
  assert two.target_split == "split" and two.target_params < two.target_params_whole


def test_plan_prints_not_split_where_nothing_is(capsys):
  assert main(["plan", "--target", "config:t5_1_1_tiny", "--batch", "2", "--mesh",
               "model=3"]) == 0
  line = next(x for x in capsys.readouterr().out.splitlines()
              if x.startswith("target parameters"))
  assert "NOT split: model=3 divides no parameter dimension" in line
  assert "split by the rules" not in line
  assert main(["plan", "--target", "config:t5_1_1_tiny", "--batch", "2", "--mesh",
               "model=2"]) == 0
  line = next(x for x in capsys.readouterr().out.splitlines()
              if x.startswith("target parameters"))
  assert "split by the rules over model=2" in line


def test_every_flag_of_every_command_has_help_text():
  """`specdec <command> --help` explains each option (the commands of installed extensions
  included; `python -m specdec_jax_lab.results`'s: the lab's tests/test_lab_commands.py)."""
  from specdec_jax.cli import build_parser
  parsers = build_parser()._subparsers._group_actions[0].choices
  bare = [(name, a.option_strings) for name, p in parsers.items() for a in p._actions
          if a.option_strings and not a.help]
  assert bare == []
  assert {"decode", "convert", "plan"} <= set(parsers)


