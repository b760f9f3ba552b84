"""Models on a device mesh: T5X's logical-axis rules, placed by `jax.sharding`.

    mesh = sd.make_mesh(data=2, model=4)            # axes ("data", "model") over 8 devices
    target = sd.load(path, mesh=mesh)               # read straight into shards (RULES_1D)
    target = sd.shard(target, mesh)                 # or place a loaded model
    drafter = sd.sharding.replicate(drafter, mesh)  # a small model: a full copy per device
    enc = sd.sharding.shard_batch(enc, mesh)        # [B, L] split by batch over "data"
    out = sd.speculative_generate(target, drafter, enc, gamma=4)

Every parameter carries T5X's logical axis names (`sd.logical_axes`, e.g. ('embed', 'mlp')
for an MLP's wi kernel). A rule maps a logical name to a mesh axis or to None
(replicated); `partition_spec` turns a parameter's names into a `PartitionSpec` the way
flax's `logical_to_mesh_axes` does: per dimension, the first rule for its name whose mesh
axis is not used by an earlier dimension.

Activations follow the same rules. A placed Model carries a `Partitioner` (its mesh and
rules: `Model.partitioner`), and its layers constrain their activations by logical names
where T5X's do (`with_logical_constraint`): queries, keys and values ('batch', 'heads',
'length', 'kv'), the MLP's hidden layer ('batch', 'length', 'mlp'), the embedded tokens
('batch', 'length', 'embed'). The decode engine pins its loop state by the same names
(`constrain_state`: caches and token buffer by batch, the target's caches by heads).
`jit` propagates these layouts to everything else, and XLA inserts the collectives. A
Model on one device has no partitioner: its program holds no constraint at all. A model
placed on several devices decodes on XLA's ops under "auto" (`sd.load(mesh=)` packs for
"xla" there); packed for a named backend (`sd.pack(sd.shard(model, mesh), kernels="cpu")`)
its kernels run inside `shard_map`, each device on its block (`kernels.dispatch.Layout`).

A dimension whose size the mesh axis does not divide is replicated instead (e.g. the 4
relative-position heads of t5_1_1_tiny on an 8-wide "model" axis): the rules describe a
layout, and the model still runs when one small tensor cannot follow it.
`shard(..., strict=True)` raises a `ConfigError` naming the parameter, axis and sizes
instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax.config import T5Config
from specdec_jax.errors import ConfigError, InputError
from specdec_jax.models.model import Model, logical_axes

Array = jax.Array
Rules = tuple[tuple[str, str | None], ...]

MESH_AXES = ("data", "model")

# Names T5X's T5 modules give their parameter and activation dimensions.
LOGICAL_AXES = frozenset({
    "batch", "vocab", "embed", "mlp", "heads", "kv", "joined_kv", "relpos_buckets",
    "abspos_buckets", "length", "layers", "stack", "mlp_activations"})

# Always replicated (t5x.partitioning.standard_logical_axis_rules appends these).
_REPLICATED: Rules = (("relpos_buckets", None), ("abspos_buckets", None), ("length", None),
                      ("layers", None), ("stack", None), ("mlp_activations", None))

# T5X's default: 1-D parameter partitioning. Weights split over "model" along their
# vocab / mlp / heads dimension; "embed" replicated; batch over "data".
RULES_1D: Rules = (("batch", "data"), ("vocab", "model"), ("embed", None), ("mlp", "model"),
                   ("heads", "model"), ("kv", None), ("joined_kv", "model")) + _REPLICATED

# 2-D parameter partitioning (parameter_partitioning_dims=2): "embed" over "data" too,
# so each weight matrix is split both ways (ZeRO-3-like; the data axis gathers weights).
RULES_2D: Rules = (("batch", "data"), ("vocab", "model"), ("mlp", "model"), ("heads", "model"),
                   ("kv", None), ("joined_kv", "model"), ("embed", "data")) + _REPLICATED

# A replicated model (`replicate`: a drafter beside a sharded target): every parameter
# whole on every device, activations split by batch only (no collective in its loop).
RULES_REPLICATED: Rules = (("batch", "data"),) + tuple(
    (name, None) for name in sorted(LOGICAL_AXES - {"batch"}))


def make_mesh(data: int = 1, model: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
  """A `Mesh` of shape [data, model] with axes ("data", "model").

  devices: the devices to lay out (default `jax.devices()`); their number must be
    `data * model` exactly. Consecutive devices share a "model" row.
  """
  for name, size in (("data", data), ("model", model)):
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
      raise ConfigError(f"make_mesh: {name} must be a positive integer, got {size!r}")
  devices = list(jax.devices() if devices is None else devices)
  if data * model != len(devices):
    raise ConfigError(f"make_mesh(data={data}, model={model}) needs data * model = "
                      f"{data * model} devices, but {len(devices)} are given "
                      f"({'jax.devices()' if devices is None else 'devices='}); choose "
                      f"data * model = {len(devices)}")
  return Mesh(np.asarray(devices, dtype=object).reshape(data, model), MESH_AXES)


def check_rules(rules: Sequence[tuple[str, str | None]], mesh: Mesh) -> Rules:
  """`rules` as a tuple of (logical name, mesh axis or None) pairs, checked against `mesh`.

  ConfigError: an entry that is not a pair, a logical name T5 does not use (a typo would
  otherwise silently leave a dimension unsplit), or a mesh axis `mesh` does not have.
  """
  out = []
  for entry in rules:
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
      raise ConfigError(f"a sharding rule is a (logical axis, mesh axis or None) pair, "
                        f"got {entry!r}")
    logical, axis = entry
    if logical not in LOGICAL_AXES:
      raise ConfigError(f"sharding rule {tuple(entry)!r}: unknown logical axis {logical!r}; "
                        f"T5's logical axes are {', '.join(sorted(LOGICAL_AXES))}")
    if axis is not None and axis not in mesh.axis_names:
      raise ConfigError(f"sharding rule {tuple(entry)!r}: the mesh has no axis {axis!r} "
                        f"(its axes: {', '.join(mesh.axis_names)})")
    out.append((logical, axis))
  return tuple(out)


def partition_spec(axes: Sequence[str | None], mesh: Mesh, rules: Rules = RULES_1D,
                   shape: Sequence[int] | None = None, name: str = "",
                   strict: bool = False) -> PartitionSpec:
  """Logical axis names, one per dimension, -> the `PartitionSpec` `rules` give them on `mesh`.

  Per dimension: the first rule for its name whose mesh axis no earlier dimension uses
  (None: replicated; a dimension named None is replicated). With `shape`, a dimension
  the mesh axis does not divide is replicated, or with `strict` a ConfigError.
  ConfigError: a name no rule maps (`name` labels the tensor in the message).

  >>> mesh = sd.make_mesh(devices=jax.devices()[:1])          # 1 x 1: any size divides
  >>> sd.sharding.partition_spec(("embed", "mlp"), mesh)     # an MLP's wi kernel
  P(None, 'model')
  >>> sd.sharding.partition_spec(("embed", "mlp"), mesh, sd.sharding.RULES_2D)
  P('data', 'model')
  >>> sd.sharding.partition_spec(("batch", "length", "embed"), mesh, sd.sharding.RULES_2D)
  P('data', None, None)
  """
  rules = check_rules(rules, mesh)
  label = f" of {name}" if name else ""
  used: set[str] = set()
  spec: list[str | None] = []
  for dim, logical in enumerate(axes):
    if logical is None:
      spec.append(None)
      continue
    candidates = [axis for rule, axis in rules if rule == logical]
    if not candidates:
      raise ConfigError(f"no sharding rule for logical axis {logical!r} (dimension {dim}"
                        f"{label}); add ({logical!r}, mesh axis or None) to the rules")
    axis = next((a for a in candidates if a is None or a not in used), None)
    if axis is not None and shape is not None and shape[dim] % mesh.shape[axis]:
      if strict:
        raise ConfigError(f"dimension {dim} ({logical!r}){label} has size {shape[dim]}, "
                          f"not divisible by mesh axis {axis!r} of size {mesh.shape[axis]}")
      axis = None        # replicated: the layout cannot split it evenly
    if axis is not None:
      used.add(axis)
    spec.append(axis)
  return PartitionSpec(*spec)


@dataclasses.dataclass(frozen=True)
class Partitioner:
  """Where a Model's activations live: a mesh and logical-axis rules (T5X's partitioner
  holds the same two). A hashable value: part of a placed Model's pytree structure, so a
  program traced for it is never reused for a Model without it.

  `sd.shard` and `sd.load(mesh=)` give a model the rules its parameters were placed by,
  `replicate` gives `RULES_REPLICATED`; `partitioner(mesh, rules)` builds one.
  """

  mesh: Mesh
  rules: Rules

  def with_logical_constraint(self, x: Array, axes: Sequence[str | None]) -> Array:
    """`x` constrained to the layout its logical `axes` (one name per dimension) map to:
    flax's `with_logical_constraint` with these rules and mesh. A name no rule maps is
    replicated (flax's fallback). A dimension its mesh axis does not divide (4 heads on
    an 8-wide "model" axis) is left unconstrained: the rules cannot split it evenly, and
    pinning it whole would add a gather where XLA splits it otherwise (as it splits the
    parameters' joined heads x head_dim columns)."""
    if len(axes) != x.ndim:
      raise ValueError(f"logical axes {tuple(axes)} do not match an array of shape {x.shape}")
    named = {name for name, _ in self.rules}
    spec = partition_spec(tuple(a if a in named else None for a in axes), self.mesh, self.rules)
    spec = PartitionSpec(*(PartitionSpec.UNCONSTRAINED
                           if axis is not None and size % self.mesh.shape[axis] else axis
                           for axis, size in zip(spec, x.shape, strict=True)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))


def partitioner(mesh: Mesh, rules: Rules | None = None) -> Partitioner | None:
  """The `Partitioner` of `rules` (default RULES_1D, checked) on `mesh`; None on a mesh
  of one device, where a constraint could only add ops to the program."""
  rules = check_rules(RULES_1D if rules is None else rules, mesh)
  return None if mesh.size == 1 else Partitioner(mesh, rules)


def config_shardings(config: T5Config, mesh: Mesh, rules: Rules | None = None,
                     strict: bool = False) -> dict[str, NamedSharding]:
  """{flat "/" key: NamedSharding} of every parameter `config` implies: where `load`
  puts each parameter before any is read."""
  from specdec_jax.io.checkpoints import tree
  rules = RULES_1D if rules is None else rules
  axes = flatten_dict(logical_axes(config), sep="/")
  shapes = tree.expected_shapes(config)
  return {path: NamedSharding(mesh, partition_spec(tuple(axes[path]), mesh, rules, shapes[path],
                                                   path, strict)) for path in shapes}


def param_shardings(model: Model, mesh: Mesh, rules: Rules | None = None,
                    strict: bool = False) -> Any:
  """The `NamedSharding` of every parameter of `model` (a tree like `model.params`)."""
  rules = RULES_1D if rules is None else rules
  axes = flatten_dict(logical_axes(model.config), sep="/")
  params = flatten_dict(model.params, sep="/")
  if set(axes) != set(params):
    raise ConfigError(f"model.params does not match its config's parameter tree "
                      f"(differ at {sorted(set(axes) ^ set(params))[:3]})")
  return unflatten_dict({
      tuple(path.split("/")): NamedSharding(
          mesh, partition_spec(tuple(axes[path]), mesh, rules, params[path].shape, path, strict))
      for path in params})


def check_mesh(mesh: Any, where: str) -> None:
  """InputError unless `mesh` is a `jax.sharding.Mesh` (a mesh spec string is the CLI's)."""
  if not isinstance(mesh, Mesh):
    hint = (" (a string such as 'data=2,model=4' is the CLI's --mesh: build the mesh with "
            "sd.make_mesh(data=2, model=4))" if isinstance(mesh, str) else "")
    raise InputError(f"{where} takes a jax.sharding.Mesh (sd.make_mesh), got "
                     f"{type(mesh).__name__} {mesh!r:.40}{hint}")


def load(path_or_name: str, mesh: Mesh, dtype: Any = "float32", config: T5Config | None = None,
         rules: Rules | None = None, strict: bool = False) -> Model:
  """`sd.load(path_or_name, dtype, config, mesh=mesh, rules=rules)`: a model loaded straight
  into the shardings `rules` give its parameters on `mesh`, leaf by leaf.

  No parameter tree is ever whole on one host or device: each leaf's device blocks are
  read alone (safetensors slices, T5X zarr index ranges, Orbax restore shardings), cast
  to `dtype` on the host, and placed; a `config:` model is initialised into its shards.
  The values are `sd.shard(sd.load(path_or_name, dtype, config), mesh, rules)`'s.
  """
  from specdec_jax.config import get_config
  from specdec_jax.io import checkpoints
  from specdec_jax.models.model import init_model
  check_mesh(mesh, "mesh=")
  if isinstance(path_or_name, str) and path_or_name.startswith("config:"):
    cfg = get_config(path_or_name[len("config:"):])
    where = unflatten_dict({tuple(k.split("/")): v for k, v in
                            config_shardings(cfg, mesh, rules, strict).items()})
    return init_model(cfg, 0, dtype, shardings=where).replace(
        partitioner=partitioner(mesh, rules))
  cfg, params = checkpoints.load_checkpoint_sharded(
      path_or_name, lambda c: config_shardings(c, mesh, rules, strict), dtype, config)
  if dtype is not None:
    cfg = cfg.replace(dtype=jax.numpy.dtype(dtype).name)
  return Model(config=cfg, params=params, partitioner=partitioner(mesh, rules))


def shard(model: Model, mesh: Mesh, rules: Rules | None = None, strict: bool = False) -> Model:
  """`model` with every parameter placed with the `NamedSharding` its logical axes map to.

  rules: (logical axis, mesh axis or None) pairs; default `RULES_1D` (T5X's default);
    `RULES_2D` also splits "embed" over "data".
  strict: a dimension the mesh axis does not divide is a ConfigError (default: that
    dimension is replicated).
  The result decodes with every `sd` method unchanged, on XLA's ops; packed kernel
  weights (`decode_weights`) are dropped (`sd.pack` it with a named backend to run the
  kernels on the mesh). It carries
  `partitioner(mesh, rules)`: its activations are constrained by the same rules.
  """
  if not isinstance(model, Model):
    raise InputError(f"shard takes an sd.Model, got {type(model).__name__} (a drafter or "
                     f"heads: sd.sharding.replicate)")
  check_mesh(mesh, "shard(model, mesh)")
  shardings = param_shardings(model, mesh, rules, strict)
  return model.replace(params=jax.device_put(model.params, shardings),
                       partitioner=partitioner(mesh, rules))


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Every array in `tree` (a Model, `ModelDrafter`, `Heads`, ...) copied whole to every
  device of `mesh`: how a drafter runs beside a sharded target. A small model's weights
  fit every device, and a full copy needs no collective inside the draft loop.
  Models in `tree` lose their packed kernel weights (they decode on XLA's ops) and carry
  `partitioner(mesh, RULES_REPLICATED)`: their activations stay split by batch only.
  """
  check_mesh(mesh, "replicate(tree, mesh)")
  replicated = NamedSharding(mesh, PartitionSpec())
  where = partitioner(mesh, RULES_REPLICATED)

  def place(x):
    if isinstance(x, Model):
      return x.replace(params=jax.device_put(x.params, replicated), partitioner=where)
    if isinstance(x, (jax.Array, np.ndarray)):
      return jax.device_put(x, replicated)
    return x

  return jax.tree_util.tree_map(place, tree, is_leaf=lambda x: isinstance(x, Model))


def shard_batch(x: Array, mesh: Mesh) -> Array:
  """x [B, ...] (encoder tokens [B, L]) placed split by batch over "data", whole over "model".

  InputError: B not divisible by the size of "data" (pad the batch, or choose another mesh).
  """
  check_mesh(mesh, "shard_batch(x, mesh)")
  x = x if isinstance(x, jax.Array) else np.asarray(x)
  if x.ndim < 1:
    raise InputError(f"shard_batch needs an array [B, ...], got shape {x.shape}")
  data = mesh.shape["data"]
  if x.shape[0] % data:
    raise InputError(f"batch {x.shape[0]} is not divisible by mesh axis 'data' of size "
                     f"{data}: pad the batch to a multiple of {data} or use a smaller "
                     f"'data' axis")
  return jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))


def spans_processes(mesh: Mesh | None) -> bool:
  """Whether `mesh` holds devices of several processes (a global mesh of a multi-host
  run: every process runs each program, and no process holds every shard)."""
  return mesh is not None and len({d.process_index for d in mesh.devices.flat}) > 1


def to_host(tree: Any) -> Any:
  """`jax.device_get(tree)` for trees whose arrays may span processes (a decode output on
  a global mesh): an array with shards on other processes is gathered whole
  (`multihost_utils.process_allgather`), so every process gets the same numpy values.

  With arrays that span processes this is a collective: every process must call it, on
  trees of the same structure, in the same order. On one process it is `jax.device_get`.
  """
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)

  return jax.tree_util.tree_map(get, tree)


# ----------------------------------------------------------------------------- decode state

def decode_layout(target: Model, inputs: Any) -> Partitioner | None:
  """The `Partitioner` a decode loop's state is pinned by (`constrain_state`), when
  `inputs` [B, L] are placed on a mesh of several devices with a "data" axis
  (`shard_batch`); else None: the one-device program is left exactly as it was.

  The target's own (`sd.shard`, `sd.load(mesh=)`), or for a target placed by hand one
  whose "heads" follow the mesh axis its first query kernel splits its columns over.
  """
  where = getattr(inputs, "sharding", None)
  if (not isinstance(where, NamedSharding) or not isinstance(where.mesh, Mesh)
      or "data" not in where.mesh.axis_names):
    return None
  mesh = where.mesh
  if mesh.size == 1:
    return None
  if getattr(target, "partitioner", None) is not None:
    return target.partitioner
  try:
    query = target.params["encoder"]["layers_0"]["attention"]["query"]["kernel"]
  except (KeyError, TypeError):
    query = None
  spec: Any = getattr(getattr(query, "sharding", None), "spec", ())
  axis = spec[1] if len(spec) > 1 and isinstance(spec[1], str) else None
  return Partitioner(mesh, (("batch", "data"), ("heads", axis)))


def constrain_cache(c: Any, layout: Partitioner, heads: str | None) -> Any:
  """A `DecoderCache` [B, H, C, Dh] pinned by batch, and by `heads` (None: whole), its
  cross K/V alike (`constrain_state`; beam search's flat [B*K] caches)."""
  pin = layout.with_logical_constraint
  kv = lambda xs: tuple(pin(x, ("batch", heads, "length", "kv")) for x in xs)
  cross = None if c.cross is None else c.cross.replace(
      key=kv(c.cross.key), value=kv(c.cross.value),
      mask=pin(c.cross.mask, ("batch", "length")))
  return c.replace(self_key=kv(c.self_key), self_value=kv(c.self_value),
                   length=pin(c.length, ("batch",)), cross=cross)


def constrain_state(state: Any, layout: Partitioner) -> Any:
  """A decode loop's initial state (`engine.RoundState`) constrained to T5X's layout by
  logical names: the token buffer ('batch', 'length'), counters ('batch',) and every
  cache by batch, the target's caches [B, H, C, Dh] (self-attention and cross K/V) also
  by heads ('batch', 'heads', 'length', 'kv': whole where H is not divisible by the
  heads' mesh axis); the proposer's caches (a drafter replicated over "model") by batch
  only.

  Why: the layers' constraints fix the activations of each call, not the loop's carry;
  with "embed" split over "data" (RULES_2D) propagation would leave the caches whole in
  batch on every row of "data", so each row would hold, and compute, the whole batch.
  """
  from specdec_jax.cache import DecoderCache
  pin = layout.with_logical_constraint
  cache = lambda c, heads: constrain_cache(c, layout, heads)

  proposer = jax.tree_util.tree_map(
      lambda x: cache(x, None) if isinstance(x, DecoderCache) else x, state.proposer,
      is_leaf=lambda x: isinstance(x, DecoderCache))
  return state.replace(seq=pin(state.seq, ("batch", "length")), n=pin(state.n, ("batch",)),
                       done=pin(state.done, ("batch",)), cache=cache(state.cache, "heads"),
                       proposer=proposer)
