"""`specdec plan`: per-device memory of a decode on a mesh, and the largest batch that fits.

    specdec plan --target config:t5_1_1_xxl --drafter config:t5_1_1_small --dtype bfloat16 \\
        --batch 8 --max-input-len 512 --max-new-tokens 64 --gamma 5 --mesh model=8 \\
        --device-memory tpu-v5e

    specdec plan --target config:gemma4_31b --drafter config:gemma4_31b_assistant \\
        --dtype bfloat16 --batch 8 --max-input-len 1024 --max-new-tokens 256 --gamma 4 \\
        --mesh model=4 --mesh model=8 --device-memory h100-80g

    specdec plan --target config:t5gemma2_4b_4b --drafter config:t5gemma2_270m_270m \\
        --dtype bfloat16 --batch 8 --max-input-len 2048 --max-new-tokens 256 --gamma 4 \\
        --mesh model=4 --device-memory h100-80g

Shapes only (`tools.plan`): no weight is read or made, and no device is needed, so any
mesh can be planned from any machine. Several --mesh or a comma list of
--device-memory print a Markdown table: one row per mesh, one "largest batch" column
per device. With a drafter, a projection of the pair's speedup from the same shapes
(`plan.speedup_projection`: the theory at assumed acceptance rates, nothing measured).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from specdec_jax import plan as plan_lib
from specdec_jax.config.gemma import GemmaAssistantConfig
from specdec_jax.flags import FlagError
from specdec_jax.flags.common import check_at_least_one
from specdec_jax.flags.mesh import parse_mesh
from specdec_jax.io.reports import to_jsonable
from specdec_jax.io.streams import emit
from specdec_jax.loading import DTYPES


def _label(mesh: dict[str, int]) -> str:
  return f"data={mesh['data']},model={mesh['model']}"


def _devices(text: str | None) -> list[tuple[str, int]]:
  if text is None:
    return []
  return [plan_lib.parse_memory(part) for part in text.split(",") if part.strip()]


def _rows(args, target, drafter) -> list[dict[str, Any]]:
  """One row per (mesh, device): the plan at --batch and the largest batch that fits."""
  meshes = [parse_mesh(m) for m in (args.mesh or ["data=1,model=1"])]
  devices: Sequence[tuple[str | None, int | None]] = (_devices(args.device_memory)
                                                      or [(None, None)])
  rows = []
  for mesh in meshes:
    shape = plan_lib.PlanSettings(
        max_input_len=args.max_input_len, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
        dtype=args.dtype, mesh=mesh, rules=plan_lib.RULES[args.rules], exact=args.exact)
    plan = plan_lib.memory_plan(target, drafter, args.batch, shape)
    for name, memory in devices:
      row: dict[str, Any] = {"mesh": _label(mesh), "plan": plan.to_dict()}
      if memory is not None:
        row.update(device=name, device_bytes=memory, headroom=args.headroom,
                   fits=plan.total_bytes <= memory * (1 - args.headroom),
                   largest_batch=plan_lib.largest_batch(memory, target, drafter, shape,
                                                        headroom=args.headroom))
      rows.append(row)
  return rows


def _split_text(p: dict[str, Any], row: dict[str, Any]) -> str:
  """How --mesh's model axis splits the target: never "split" where nothing is."""
  whole = plan_lib.fmt_bytes(p["target_params_whole"])
  model = p["mesh"].get("model", 1)
  if p["target_split"] == "one device":
    return "one device: whole"
  if p["target_split"] == "replicated":
    return (f"NOT split: model={model} divides no parameter dimension the rules shard; "
            f"each device holds all {whole}")
  return f"split by the rules over model={model}; {whole} whole"


def _text(args, rows) -> str:
  gib = plan_lib.fmt_bytes
  what = (f"{args.target} (target)" + (f" + {args.drafter} (drafter, gamma {args.gamma})"
                                        if args.drafter else "") +
          f", {args.dtype}, batch {args.batch}, input {args.max_input_len} tokens, "
          f"{args.max_new_tokens} new tokens, rules {args.rules}"
          + (", exact mode" if args.exact else "")
          + (f", {args.headroom:.0%} of each device kept free" if args.headroom else ""))
  if len(rows) == 1:
    row = rows[0]
    p = row["plan"]
    tc, dc = p["target_cache"], p["drafter_cache"]
    cross = f", cross K/V {gib(tc['cross_kv'])}" if tc["cross_kv"] else ""
    lines = [f"specdec plan: {what}, mesh {row['mesh']} (bytes per device)",
             f"target parameters    {gib(p['target_params'])}   ({_split_text(p, row)})",
             f"drafter parameters   {gib(p['drafter_params'])}   (replicated)",
             f"target caches        {gib(sum(tc.values()))}   (self K/V {gib(tc['self_kv'])}"
             f" at {p['slots']} slots{cross})",
             f"drafter caches       {gib(sum(dc.values()))}",
             f"transients           {gib(p['transient_bytes'])}   (largest: "
             f"{max(p['transients'], key=p['transients'].get)})",
             f"total                {gib(p['total_bytes'])}"]
    if "device" in row:
      lines.append(f"{row['device']:<20} {gib(row['device_bytes'])}: "
                   f"{'fits' if row['fits'] else 'does NOT fit'}; largest batch "
                   f"{row['largest_batch'] or 'none (the parameters alone do not fit)'}"
                   + (f" (headroom {row['headroom']:.0%})" if row["headroom"] else ""))
    return "\n".join(lines)
  devices = list(dict.fromkeys(row["device"] for row in rows if "device" in row))
  head = ["mesh", "params", "caches", "transients", f"total (batch {args.batch})"]
  head += [f"largest batch, {d}" for d in devices]
  lines = [f"specdec plan: {what} (bytes per device)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for mesh in dict.fromkeys(row["mesh"] for row in rows):
    group = [row for row in rows if row["mesh"] == mesh]
    p = group[0]["plan"]
    cells = [mesh, gib(p["params_bytes"]), gib(p["cache_bytes"]), gib(p["transient_bytes"]),
             gib(p["total_bytes"])]
    cells += [str(row["largest_batch"] or "does not fit") for row in group if "device" in row]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _projection_text(projection: dict[str, Any] | None) -> str:
  if projection is None:
    return ""
  lines = ["", "", f"PROJECTED speedup over the baseline (not measured): c = "
           f"{projection['c']:.4f}; {projection['basis']}", "",
           "| alpha (assumed) | tokens/target call | speedup at gamma | best gamma (1-16) "
           "| its speedup |",
           "|---|---|---|---|---|"]
  lines += [f"| {r['alpha']:.1f} | {r['tokens_per_target_call']:.2f} | {r['speedup']:.2f}x "
            f"(gamma {r['gamma']}) | {r['best_gamma']} | {r['best_speedup']:.2f}x |"
            for r in projection["rows"]]
  return "\n".join(lines)


def run(args) -> int:
  check_at_least_one(batch=args.batch, max_input_len=args.max_input_len,
                     max_new_tokens=args.max_new_tokens, gamma=args.gamma)
  if not 0.0 <= args.headroom < 1.0:
    raise FlagError(f"--headroom must be in [0, 1), got {args.headroom}")
  target = plan_lib.config_of(args.target)
  if isinstance(target, GemmaAssistantConfig):
    raise FlagError("--target is a Gemma 4 assistant: give it as --drafter beside its Gemma 4 "
                    "target")
  drafter = plan_lib.config_of(args.drafter) if args.drafter else None
  rows = _rows(args, target, drafter)
  projection = (None if drafter is None else
                plan_lib.speedup_projection(target, drafter, args.gamma))
  if args.json:
    emit(json.dumps(to_jsonable({"settings": {k: v for k, v in vars(args).items()
                                              if k not in ("func", "argv")},
                                 "rows": rows, "projection": projection})))
  else:
    emit(_text(args, rows) + _projection_text(projection))
  return 0


def add(subparsers) -> None:
  p = subparsers.add_parser(
      "plan", help="per-device memory of a decode on a mesh, and the largest batch that fits",
      description="Per-device bytes of each model's parameters (split by T5X's rules; the "
      "drafter replicated), the decoder caches (self-attention K/V at capacity "
      "max_new_tokens + gamma + 1, cross K/V over the input; a decoder-only model's cache "
      "also holds its prompt) and the largest transients (float32 logits and attention "
      "scores), from shapes alone: nothing is loaded and no device is needed. Framework "
      "overhead is not counted: keep a margin (--headroom). With a drafter (a model, or a "
      "Gemma 4 assistant), a PROJECTION of the speedup from the cost model at assumed "
      "acceptance rates.")
  p.add_argument("--target", required=True, metavar="NAME_OR_PATH",
                 help="config:NAME, a named config, a config JSON, or a checkpoint dir / "
                 "bundled name (its stored config)")
  p.add_argument("--drafter", metavar="NAME_OR_PATH",
                 help="the drafter, as --target (none: the baseline's memory)")
  p.add_argument("--batch", type=int, default=1, help="rows per decode call (default 1)")
  p.add_argument("--max-input-len", type=int, default=512,
                 help="encoder tokens per row, or a decoder-only model's prompt tokens "
                 "(default 512)")
  p.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
  p.add_argument("--gamma", type=int, default=5, help="drafts per round (default 5)")
  p.add_argument("--dtype", choices=DTYPES, default="float32",
                 help="parameters and activations (default float32)")
  p.add_argument("--mesh", action="append", metavar="data=D,model=M",
                 help="the mesh shape (default one device); repeat for a table; any shape: "
                 "no device is needed")
  p.add_argument("--rules", choices=sorted(plan_lib.RULES), default="1d",
                 help="T5X's 1-D parameter partitioning (default) or 2-D (embed over data)")
  p.add_argument("--exact", action="store_true",
                 help="exact mode: calls and cache slack of engine.EXACT_WIDTH tokens")
  p.add_argument("--device-memory", metavar="SIZE_OR_PRESET[,...]",
                 help="bytes per device, e.g. 16GiB or 80GB, or presets: "
                 + ", ".join(f"{k} ({v >> 30} GiB)" for k, v in plan_lib.DEVICES.items()))
  p.add_argument("--headroom", type=float, default=0.0,
                 help="fraction of device memory kept free for the runtime (default 0)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.set_defaults(func=run)
