"""From a JobSpec to a Plan: benchmark defaults applied, dataset resolved and parsed, tasks
selected (limit, then shard), keys enumerated lazily. Blocking file I/O: call off the event loop.

A dataset is a JSONL file, or a generator spec (a `.json` file holding `{"reasoning_gym": ...}`,
rollmesh.procedural.spec): its rows are generated here, the same rows for the same spec, so a
resumed job finds its tasks at the same indices as any file's; or a folder of Harbor tasks (one row
per task folder, in name order: verifier/bridges/container/task.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollmesh.mesh import responses_items
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.errors import NotJson
from rollmesh.registry import ArtifactNotFound
from rollmesh.registry import Catalog
from rollmesh.registry import Kind
from rollmesh.scheduler.convert import sampling_to_pb
from rollmesh.scheduler.drivers.agent_loop import ROW_SAMPLING
from rollmesh.scheduler.drivers.agent_loop import has_prompt
from rollmesh.scheduler.drivers.agent_loop import responses_input
from rollmesh.scheduler.drivers.agent_loop import row_tools
from rollmesh.scheduler.drivers.modes import check_mode
from rollmesh.scheduler.errors import BenchmarkNotFound
from rollmesh.scheduler.errors import DatasetNotFound
from rollmesh.scheduler.errors import DatasetRowTooLarge
from rollmesh.scheduler.errors import InvalidBenchmark
from rollmesh.scheduler.errors import InvalidJobSpec
from rollmesh.scheduler.errors import MalformedDatasetRow
from rollmesh.scheduler.errors import NoPrompt
from rollmesh.scheduler.metrics import default_k_values
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import DEFAULT_MAX_STEPS
from rollmesh.scheduler.spec import SAMPLING_FIELDS
from rollmesh.scheduler.spec import JobSpec
from rollmesh_client import max_item_bytes

Json = dict[str, Any]
#: A dataset folder's generator spec, used when the folder holds no .jsonl.
SPEC_FILE = "reasoning_gym.json"


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, resolved once at submit time."""

    spec: JobSpec  # with benchmark defaults applied
    dataset_path: Path
    rows: list[Json]
    task_indices: list[int]
    num_repeats: int
    max_steps: int
    k_values: tuple[int, ...] = field(default=())

    @property
    def total(self) -> int:
        return len(self.task_indices) * self.num_repeats

    def keys(self) -> Iterator[RolloutKey]:
        """Every key of the job, task-major (lazy: memory stays flat for large jobs)."""
        for t in self.task_indices:
            for r in range(self.num_repeats):
                yield RolloutKey(t, r)


def select_tasks(num_rows: int, *, limit: int = 0, shard_index: int = 0, shard_count: int = 0) -> list[int]:
    """Task indices (in the full dataset) of this job: the first `limit`, then those with i % n == shard."""
    end = min(num_rows, limit) if limit > 0 else num_rows
    if shard_count <= 1:
        return list(range(end))
    return [i for i in range(end) if i % shard_count == shard_index]


def load_benchmark(catalog: Catalog, name: str) -> Json:
    """`benchmarks/<name>/benchmark.json` (or `benchmarks/<name>.json`) as a dict."""
    try:
        found = catalog.locate(Kind.BENCHMARK, name)
    except ArtifactNotFound as exc:
        raise BenchmarkNotFound(exc.message, metadata={"benchmark": name}) from None
    path = found.path / "benchmark.json" if found.is_dir else found.path
    if not path.is_file():
        raise InvalidBenchmark(f"benchmark {name!r} has no benchmark.json at {path}")
    try:
        data = untrusted_json.loads(path.read_text())
    except NotJson as exc:
        raise InvalidBenchmark(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidBenchmark(f"{path}: must hold a JSON object")
    return data


def apply_benchmark(spec: JobSpec, bench: Json) -> JobSpec:
    """Benchmark values fill what the spec leaves unset; the spec wins."""
    sampling = {k: v for k, v in dict(bench.get("sampling", {})).items() if k in SAMPLING_FIELDS}
    sampling.update(spec.sampling)
    agent = dict(bench.get("agent", {}))
    return replace(
        spec,
        dataset=spec.dataset or str(bench.get("dataset", "")),
        environment=spec.environment or str(bench.get("environment", "")),
        num_repeats=spec.num_repeats or int(bench.get("num_repeats", 0)),
        max_steps=spec.max_steps or int(agent.get("max_steps", 0)),
        system_prompt=spec.system_prompt or str(agent.get("system_prompt", "")),
        sampling=sampling,
        k_values=spec.k_values or tuple(int(k) for k in bench.get("k_values", ())),
    )


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.endswith((".jsonl", ".json")) or ref.startswith(".")


def resolve_dataset(catalog: Catalog, ref: str) -> Path:
    """A JSONL (or generator spec) path, or a dataset artifact: a file, or a folder's test.jsonl,
    its single .jsonl, or its reasoning_gym.json."""
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if path.is_dir() and _harbor_tasks(path):
            return path
        if not path.is_file():
            raise DatasetNotFound(f"dataset file {ref!r} does not exist", metadata={"dataset": ref})
        return path
    try:
        found = catalog.locate(Kind.DATASET, ref)
    except ArtifactNotFound as exc:
        raise DatasetNotFound(exc.message, metadata={"dataset": ref}) from None
    if not found.is_dir or _harbor_tasks(found.path):
        return found.path
    test = found.path / "test.jsonl"
    if test.is_file():
        return test
    files = sorted(p for p in found.path.glob("*.jsonl") if p.is_file())
    if len(files) == 1:
        return files[0]
    spec = found.path / SPEC_FILE
    if not files and spec.is_file():
        return spec
    names = ", ".join(p.name for p in files) or "none"
    raise DatasetNotFound(
        f"dataset {ref!r} is a folder without test.jsonl and with {len(files)} .jsonl files ({names}); "
        "name the file as a path instead",
        metadata={"dataset": ref},
    )


def load_rows(path: Path, *, max_row_bytes: int | None = None, text_only: bool = True) -> list[Json]:
    """Parse every row; a malformed one is an error naming its line number, and so is one longer
    than `max_row_bytes` (default: what a stream item may carry, from ROLLMESH_MAX_MESSAGE_MB),
    since the requests made from it could not be sent. `text_only=False` accepts input messages
    with image or audio parts (rows read for something other than asking a model: reverify)."""
    limit = max_row_bytes if max_row_bytes is not None else max_item_bytes()
    if path.suffix == ".json":
        return generated_rows(path)
    if path.is_dir():
        return harbor_rows(path)
    rows: list[Json] = []

    def malformed(problem: str) -> MalformedDatasetRow:
        return MalformedDatasetRow(
            f"{path}:{lineno}: {problem}", metadata={"path": str(path), "line": str(lineno)}
        )

    with path.open("rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), start=1):
            size = len(raw)
            while size > limit and raw and not raw.endswith(b"\n"):  # count the rest, holding 1 MiB
                raw = f.readline(1 << 20)  # (a model file named by mistake was read whole: GBs)
                size += len(raw)
            if size > limit:
                raise DatasetRowTooLarge(
                    f"{path}:{lineno}: the row is {size:,} bytes, over the {limit:,}-byte limit of a "
                    "request (set ROLLMESH_MAX_MESSAGE_MB to raise it)",
                    metadata={"path": str(path), "line": str(lineno), "size": str(size), "limit": str(limit)},
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = f"byte 0x{raw[exc.start]:02x} at offset {exc.start}"
                raise malformed(f"not UTF-8 text ({byte}); a dataset is JSONL") from None
            if not line.strip():
                continue
            try:
                row = untrusted_json.loads(line)
            except NotJson as exc:
                raise malformed(f"not valid JSON ({exc})") from None
            problem = _row_problem(row, text_only)
            if problem:
                raise malformed(problem)
            rows.append(row)
    if not rows:
        raise MalformedDatasetRow(f"{path}: the dataset has no rows", metadata={"path": str(path)})
    return rows


def _harbor_tasks(path: Path) -> bool:
    from rollmesh.verifier.bridges.container.task import task_folders

    return bool(task_folders(path))


def harbor_rows(path: Path) -> list[Json]:
    """A folder of Harbor tasks as rows (verifier/bridges/container/task.py): one per task, its
    instruction the prompt; a task that does not parse is an error naming it and its field."""
    from rollmesh.verifier.bridges.container.errors import BadHarborTask
    from rollmesh.verifier.bridges.container.task import rows

    try:
        return list(rows(path))
    except BadHarborTask as exc:
        raise MalformedDatasetRow(f"{path}: {exc.message}", metadata={"path": str(path)}) from None


def generated_rows(path: Path) -> list[Json]:
    """The rows of the generator spec in `path` (reasoning-gym makes them: CPU work)."""
    from rollmesh.procedural import ProceduralSpec
    from rollmesh.procedural.rows import generate_rows

    try:
        data = untrusted_json.loads(path.read_text(encoding="utf-8"))
    except (NotJson, UnicodeDecodeError) as exc:
        raise MalformedDatasetRow(f"{path}: a generator spec must be JSON ({exc})") from None
    rows = list(generate_rows(ProceduralSpec.from_json(data, where=str(path))))
    for index, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise MalformedDatasetRow(f"{path}: generated row {index}: {problem}")
    return rows


def _row_problem(row: Any, text_only: bool = True) -> str:
    if not isinstance(row, dict):
        return f"a row must be a JSON object, not {type(row).__name__}"
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return "missing `responses_create_params` (an object with `input`)"
    inp = params.get("input")
    if isinstance(inp, str):
        if not inp:
            return "`responses_create_params.input` is empty"
    elif not isinstance(inp, list):
        return "`responses_create_params.input` must be a list of messages or a string"
    elif responses_input(inp):
        try:
            responses_items.messages_from_items(inp, default_role="user")
        except responses_items.NotResponsesItem as exc:
            if text_only or "content parts" not in str(exc):
                return f"`responses_create_params.input{exc.where}`: {str(exc).split(': ', 1)[1]}"
    else:
        for i, m in enumerate(inp):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"].strip():
                return f"`responses_create_params.input[{i}]` is not a message with a `role`"
            try:  # an image or audio part was dropped: the model was asked half the question
                content_text(m.get("content"), strict=text_only)
            except ValueError as exc:
                return f"`responses_create_params.input[{i}].content`: {exc} (rollmesh sends text only)"
    if not isinstance(params.get("instructions") or "", str):
        return "`responses_create_params.instructions` must be a string"
    tools = params.get("tools", [])
    if not isinstance(tools, list):
        return "`responses_create_params.tools` must be a list"
    for src, dst in ROW_SAMPLING:
        value = params.get(src)
        # A value sampling cannot take failed every rollout of the row with INTERNAL at run time.
        if value is not None and not _is_sampling_value(dst, value):
            return f"`responses_create_params.{src}` must be {_SAMPLING_KINDS[dst]}, not {value!r}"
    return ""


_SAMPLING_KINDS = {
    "temperature": "a number",
    "top_p": "a number",
    "max_tokens": "an integer",
    "top_k": "an integer",
    "stop": "a string or a list of strings",
}


def _is_sampling_value(name: str, value: Any) -> bool:
    if name == "stop":
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return False
    try:
        sampling_to_pb({name: value})
    except (TypeError, ValueError, OverflowError):
        return False
    return name not in ("temperature", "top_p") or math.isfinite(float(value))


def refuse_promptless(plan: Plan) -> None:
    """NoPrompt for a job of a stateless environment whose selected rows include one with an empty
    `input` and no tools of its own: no session is seeded for it, so nothing can give its prompt."""
    for index in plan.task_indices:
        row = plan.rows[index]
        if not has_prompt(row) and not row_tools(row):
            raise NoPrompt(
                f"{plan.dataset_path}: row {index} has an empty `responses_create_params.input` and "
                f"environment {plan.spec.environment!r} is stateless: it gives no first observation",
                metadata={"environment": plan.spec.environment, "task_index": str(index)},
            )


def build_plan(catalog: Catalog, spec: JobSpec) -> Plan:
    """Resolve a validated spec into a Plan (raises NOT_FOUND / INVALID_ARGUMENT errors)."""
    if spec.benchmark:
        spec = apply_benchmark(spec, load_benchmark(catalog, spec.benchmark))
    if not spec.dataset:
        raise InvalidJobSpec(f"benchmark {spec.benchmark!r} names no dataset; set `dataset`")
    if not spec.environment:
        raise InvalidJobSpec(
            "the job names no environment; set `environment`", metadata={"field": "environment"}
        )
    if spec.oracle and spec.agent_program:
        raise InvalidJobSpec(
            "an oracle job runs each task's solution: it takes no agent program", metadata={"field": "oracle"}
        )
    try:
        check_mode(spec.agent_program_mode, spec.agent_program)
    except ValueError as exc:
        raise InvalidJobSpec(str(exc), metadata={"field": "agent.program_mode"}) from None
    path = resolve_dataset(catalog, spec.dataset)
    rows = load_rows(path)
    tasks = select_tasks(
        len(rows), limit=spec.limit, shard_index=spec.shard_index, shard_count=spec.shard_count
    )
    if not tasks:
        raise InvalidJobSpec(
            f"the job selects no tasks: {len(rows)} rows, limit {spec.limit}, "
            f"shard {spec.shard_index}/{spec.shard_count}",
            metadata={"field": "shard"},
        )
    num_repeats = spec.num_repeats or 1
    k_values = spec.k_values or tuple(default_k_values(num_repeats))
    if any(k > num_repeats for k in k_values):
        raise InvalidJobSpec(
            f"k_values {list(k_values)} exceed num_repeats {num_repeats}", metadata={"field": "k_values"}
        )
    return Plan(
        spec=spec,
        dataset_path=path,
        rows=rows,
        task_indices=tasks,
        num_repeats=num_repeats,
        max_steps=spec.max_steps or DEFAULT_MAX_STEPS,
        k_values=k_values,
    )
