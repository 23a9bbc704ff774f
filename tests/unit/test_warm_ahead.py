"""What a warm interpreter makes ahead for its rollouts (mesh/_warm_ahead.py): a rollout gets what
it would have built itself, its own copy, never what it could not have read. Each case runs in a
fresh interpreter (the module rewires `ssl` for the process it runs in), forking a "rollout" as
mesh/_warm.py does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

AHEAD = Path(__file__).resolve().parents[2] / "services/rollmesh/mesh/_warm_ahead.py"

PRELUDE = textwrap.dedent(
    f"""
    import importlib.util, json, os, ssl, sys
    spec = importlib.util.spec_from_file_location("_warm_ahead", {str(AHEAD)!r})
    ahead_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ahead_module)

    def in_child(fn):
        # fn() in a forked process (a rollout), its JSON result back through a pipe
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                out = fn()
            except Exception as exc:
                out = {{"error": type(exc).__name__}}
            os.write(w, json.dumps(out).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.waitpid(pid, 0)
        return json.loads(data)

    def summary(ctx):
        return {{"certs": len(ctx.get_ca_certs()), "verify": int(ctx.verify_mode),
                 "hostname": ctx.check_hostname, "options": int(ctx.options),
                 "minimum": str(ctx.minimum_version)}}
    """
)


def _run(body: str, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_rollouts_first_tls_context_is_its_own_copy_of_the_spare_and_the_same_as_a_new_one() -> None:
    out = _run(
        """
        fresh = summary(ssl.create_default_context())
        ahead = ahead_module.Ahead()
        ahead.prepare()
        spare = ahead.spares["ssl.create_default_context"]

        def rollout():
            held = spare.ready[spare._key((), {})][0]
            a, b = ssl.create_default_context(), ssl.create_default_context()
            return {"first": summary(a), "second": summary(b), "same": a is b, "spare_given": a is held}

        first, second = in_child(rollout), in_child(rollout)
        print(json.dumps({"fresh": fresh, "first": first, "second": second,
                          "wrapped": ssl.create_default_context.__name__,
                          "kept": bool(spare.ready.get(spare._key((), {})))}))
        """
    )
    assert out["first"]["spare_given"] and out["second"]["spare_given"]  # each rollout its copy
    assert out["kept"]  # the interpreter's own spare is untouched
    for run in (out["first"], out["second"]):
        assert run["first"] == run["second"] == out["fresh"] and run["first"]["certs"] > 0
        assert run["same"] is False
    assert out["wrapped"] == "create_default_context"


def test_a_spare_is_not_given_when_a_variable_or_a_file_it_read_differs_or_is_unreadable(
    tmp_path: Path,
) -> None:
    import ssl

    bundle = ssl.get_default_verify_paths().openssl_cafile
    if not bundle or not os.path.isfile(bundle):
        pytest.skip("no system CA bundle on this host")
    private = tmp_path / "private.pem"
    private.write_bytes(Path(bundle).read_bytes())
    private.chmod(0o600)
    out = _run(
        f"""
        ahead = ahead_module.Ahead()
        ahead.prepare()
        spare = ahead.spares["ssl.create_default_context"]
        spare.fill([{{"cafile": {str(private)!r}}}])

        def given(**kwargs):
            held = spare.ready[spare._key((), kwargs)][0]
            return ssl.create_default_context(**kwargs) is held

        def other_variable():
            os.environ["SSL_CERT_FILE"] = {str(private)!r}
            return {{"default_given": given()}}

        def as_another_user():
            os.setgid(65534)
            os.setuid(65534)
            ssl.create_default_context(cafile={str(private)!r})  # PermissionError, as it would be
            return {{"built": True}}

        def as_root():
            return {{"given": given(cafile={str(private)!r})}}

        def file_changed():
            os.utime({str(private)!r}, ns=(1, 1))
            return {{"given": given(cafile={str(private)!r})}}

        print(json.dumps({{"other_variable": in_child(other_variable),
                          "another_user": in_child(as_another_user) if os.geteuid() == 0 else None,
                          "root": in_child(as_root), "changed": in_child(file_changed)}}))
        """
    )
    assert out["other_variable"] == {"default_given": False}
    if out["another_user"] is not None:
        assert out["another_user"] == {"error": "PermissionError"}
    assert out["root"] == {"given": True}
    assert out["changed"] == {"given": False}


MODELS = textwrap.dedent(
    """
    from __future__ import annotations
    import pydantic

    class Reply(pydantic.BaseModel):
        part: Part

    class Part(pydantic.BaseModel):
        text: str
    """
)


def test_the_models_a_rollout_completed_are_completed_ahead_for_the_rollouts_after(
    tmp_path: Path,
) -> None:
    (tmp_path / "lib_models.py").write_text(MODELS)
    out = _run(
        f"""
        sys.path.insert(0, {str(tmp_path)!r})
        import lib_models
        # at class creation Reply named a type not yet defined: built at its first use
        ahead = ahead_module.Ahead()
        ahead.prepare()
        n = ahead.models.index(lib_models.Reply)

        def rollout():
            was = lib_models.Reply.__dict__["__pydantic_complete__"]
            lib_models.Reply.model_validate({{"part": {{"text": "hi"}}}})
            return {{"was": was, "report": ahead.report()}}

        first = in_child(rollout)
        taken = [ahead.take(line) for line in first["report"]]
        learned = [ahead.learned]
        junk = [ahead.take(line) for line in ("model 99999", "model x", "email.mime", "model -1")]
        again = [ahead.take(line) for line in first["report"]]  # told again: nothing new
        learned.append(ahead.learned)
        second = in_child(rollout)
        print(json.dumps({{"n": n, "first": first, "taken": taken, "junk": junk, "again": again,
                          "learned": learned, "second": second}}))
        """
    )
    assert out["first"]["was"] is False and f"model {out['n']}" in out["first"]["report"]
    assert all(out["taken"]) and all(out["again"])
    assert out["junk"] == [True, True, False, True]  # ours (ignored) but for a module name
    # One model learned: neither junk nor a line told again counts (the interpreter then has
    # nothing to prepare: a program repeating its report costs it no collection).
    assert out["learned"] == [1, 1]
    assert out["second"] == {"was": True, "report": []}
