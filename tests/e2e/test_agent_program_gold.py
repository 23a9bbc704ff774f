"""An agent program never sees the gold answer (issue 39). `rollmesh run --agent-program` (embedded
mesh, fake model, the built-in `arithmetic` environment) runs a program that searches everything it
can read for its rows' gold: its task document (stdin and the file), its environment and argv, the
files under its folder, /tmp, /var/tmp, /dev/shm, every /proc/<pid>/{environ,cmdline} it can read,
its tools and capture URLs, and the job's own dataset file and output folder, whose paths it is told.
It looks for the gold by hash (it cannot hold the gold itself: it would find it in its own source),
in every token of what it read. The same program asks for a model the job does not serve: the row
records the name asked for and the model that answered; and its answer file's text is in the row."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import REPO
from tests.procs import run_cli

GOLD = ["7919313", "104729011", "zq7-private-note-4471"]  # two expected answers, a private field
ROWS = [
    {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 7919000 + 313?"}]},
        "expected_answer": "7919313",
        "notes": "zq7-private-note-4471",
    },
    {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 104729000 + 11?"}]},
        "expected_answer": "104729011",
    },
]
ASKED = "gpt-4o-mini-not-served"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


SEARCHER = textwrap.dedent(
    """
    import hashlib, json, os, re, sys, urllib.request

    GOLD, PROMPT = set(sys.argv[1].split(",")), sys.argv[2]
    DATASET, RUNS, CONTROL = "DATASET_PATH", "RUNS_PATH", "CONTROL_PATH"  # (an argument would be readable)
    read = {"stdin": sys.stdin.read(), "env": json.dumps(dict(os.environ)), "argv": json.dumps(sys.argv)}

    def grab(where, path):
        try:
            with open(path, "rb") as f:
                read[where] = f.read(1 << 20).decode(errors="replace")
        except OSError:
            pass

    grab("task_file", os.environ["ROLLMESH_TASK_FILE"])
    roots = {os.getcwd(), os.environ["HOME"], "/tmp", "/var/tmp", "/dev/shm", RUNS, os.path.dirname(DATASET)}
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                grab(f"file:{os.path.join(folder, name)}", os.path.join(folder, name))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("environ", "cmdline"):
            grab(f"proc:{pid}/{part}", f"/proc/{pid}/{part}")
    key = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    urls = {"tools": os.environ["ROLLMESH_TOOLS_URL"], "models": os.environ["OPENAI_BASE_URL"] + "/models"}
    for where, url in urls.items():
        if url:
            got = urllib.request.urlopen(urllib.request.Request(url, headers=key), timeout=30)
            read[where] = got.read().decode()

    def hashes(text):
        return {hashlib.sha256(t.encode()).hexdigest() for t in re.findall(r"[A-Za-z0-9_.+-]+", text)}

    task = json.loads(read["stdin"])
    body = {"model": "ASKED", "messages": task["messages"]}
    call = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={**key, "Content-Type": "application/json"},
    )
    urllib.request.urlopen(call, timeout=60).read()
    with open(os.environ["ROLLMESH_ANSWER_FILE"], "w") as f:
        f.write("my answer, from the file")
    print(json.dumps({
        "gold_in": sorted(where for where, text in read.items() if hashes(text) & GOLD),
        "prompt_seen": PROMPT in hashes(read["stdin"]) or None,
        "task_keys": sorted(task["task"]),
        "dataset_text": read.get("file:" + DATASET, "<unreadable>"),
        "runs": sorted(os.listdir(RUNS)) if os.path.isdir(RUNS) else None,
        "control": read.get("file:" + CONTROL),
        "searched": len(read),
    }))
    """
).replace("ASKED", ASKED)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder other users may read, outside /tmp (a program gets a fresh /tmp of its own): where a
    dataset and a job's output usually are (a checkout, a data disk)."""
    folder = Path(tempfile.mkdtemp(prefix=".gold-test-", dir=REPO))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_program_that_searches_everything_it_can_read_finds_no_gold(
    tmp_path: Path, shared: Path
) -> None:
    data, runs, control = shared / "data.jsonl", shared / "runs", shared / "control.txt"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    control.write_text("control: readable by anyone")
    searcher = shared / "searcher.py"
    paths = {"DATASET_PATH": str(data), "RUNS_PATH": str(runs), "CONTROL_PATH": str(control)}
    searcher.write_text(functools.reduce(lambda text, kv: text.replace(*kv), paths.items(), SEARCHER))
    for f in (data, control, searcher):
        f.chmod(0o644)
    args = [",".join(_sha(g) for g in GOLD), _sha("7919000")]
    program = " ".join([sys.executable, str(searcher), *args])
    code, _, err = await run_cli(
        *("run", "--backend", "fake", "-e", "arithmetic", "-d", str(data), "-n", "2"),
        *("--output-dir", str(runs), "--job-id", "gold", "--agent-program", program),
        timeout_s=600,
    )
    assert code == 0, err[-4000:]
    rows = [json.loads(line) for line in (runs / "gold" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        run = row["agent_program"]
        assert run["exit_code"] == 0, run["stderr"][-2000:]
        seen = json.loads(run["stdout"])
        # Its task document held the prompt (the search works: it found the prompt's number)...
        assert seen["task_keys"] == ["responses_create_params"] and seen["searched"] > 5
        if row["task_index"] == 0:
            assert seen["prompt_seen"] is True
        # ... and no gold in anything it read.
        if "mount" in run["sandbox"]:
            assert seen["gold_in"] == [], seen["gold_in"]
            assert seen["control"] == "control: readable by anyone"  # the folder is within its reach
            assert seen["dataset_text"] == "" and seen["runs"] == []  # but the job's files are hidden
        else:  # no mount namespace (not root): it reads what the scheduler's user reads, the dataset too
            assert all(w.startswith("file:") for w in seen["gold_in"]), seen["gold_in"]
        # The row keeps the answer file's text, and which model the program asked for and got.
        assert run["answer"] == "my answer, from the file" and run["answer_file"] is True
        (models,) = run["models"]
        assert models["requested"] == ASKED and models["calls"] == 1
        assert models["answered"] and models["answered"] != ASKED
        assert row["chat_messages"][-1]["role"] == "assistant"
