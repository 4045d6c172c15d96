"""The file browser's routes through the real tools actor (PROTOCOL_0_19.md §H).

One real host for the module (its tools actor has no workspace, so every session gets its
own directory, T-10: the tests do not see each other's files), and a stand-in gateway on the
bus that sends ``HttpRequest`` messages the way the gateway forwards the server's tunnelled
requests. Mutations publish ``session.changed_files.invalidated`` (T-20) through dispatch,
which the stand-in collects as the session's stream.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.tools.messages import ToolExec
from corral.routes import HttpRequest
from corral.tools import env_files
from tests.conftest import FAST_LIVENESS, HostProcess, processes_of
from tests.integration._gateway import FakeGateway, fake_gateway

SECRET = "corral-env-routes-secret-0d5e"


@pytest.fixture(scope="module")
def ehost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    base = tmp_path_factory.mktemp("env-routes")
    config = (
        FAST_LIVENESS
        + f"[actors.tools.options]\nos_env_root = {json.dumps(str(base / 'envs'))}\n"
        + '[actors.dispatch.options]\nsubscribers = ["test-gateway"]\n'
        + "[server]\nenabled = false\n"
    )
    host = HostProcess(base / "state", config)
    with pytest.MonkeyPatch.context() as env:
        # A secret in the host's environment: a shell the file browser runs must not see it.
        env.setenv("CORRAL_TEST_ROUTES_TOKEN", SECRET)
        env.delenv("CORRAL_WORKSPACE", raising=False)
        env.delenv("OMNIGENT_RUNNER_WORKSPACE", raising=False)
        host.start()
    try:
        yield host
    finally:
        if host.proc is not None and host.proc.poll() is None:
            host.stop()
        for pid in processes_of(host.state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Session:
    sid: str
    root: Path

    @property
    def env(self) -> str:
        return f"/v1/sessions/{self.sid}/resources/environments"

    @property
    def fs(self) -> str:
        return f"{self.env}/default/filesystem"


@pytest.fixture
def sess(ehost: HostProcess) -> Session:
    """A fresh session and its directory (made here so a test can fill it first)."""
    sid = f"sess_{uuid.uuid4().hex[:12]}"
    root = ehost.config_path.parent / "envs" / sid / "workspace"
    root.mkdir(parents=True)
    return Session(sid, root.resolve())


async def call(
    gw: FakeGateway, method: str, path: str, body: Any = None, query: str = ""
) -> tuple[int, Any]:
    reply = await gw.peer.call(
        "tools",
        HttpRequest(
            request_id=uuid.uuid4().hex,
            method=method,
            path=path,
            query=query,
            body=json.dumps(body).encode() if body is not None else b"",
            reply_to=gw.peer.name,
        ),
        timeout=30,
    )
    return reply.status, json.loads(reply.body)


def assert_error(answer: tuple[int, Any], status: int, code: str) -> str:
    """§H.2: every error is ``{"error": {"code", "message"}}``; returns the message."""
    got_status, body = answer
    assert (got_status, body["error"]["code"]) == (status, code), body
    assert list(body) == ["error"] and isinstance(body["error"]["message"], str)
    return body["error"]["message"]


def invalidations(gw: FakeGateway, sid: str) -> list[dict[str, Any]]:
    return [e for e in gw.events.get(sid, []) if e["type"] == "session.changed_files.invalidated"]


async def test_environments_list_default_for_every_session(ehost, sess) -> None:
    """``default`` is listed for any session, one no tool ever ran for included (§H.1)."""
    async with fake_gateway(ehost.endpoint) as gw:
        status, listed = await call(gw, "GET", sess.env)
        assert status == 200
        default = {
            "id": "default",
            "object": "session.resource",
            "type": "environment",
            "session_id": sess.sid,
            "name": "Primary environment",
            "metadata": {"environment_type": "caller_process", "role": "primary"},
        }
        assert listed == {
            "object": "list",
            "data": [default],
            "first_id": "default",
            "last_id": "default",
            "has_more": False,
        }
        status, resources = await call(gw, "GET", f"/v1/sessions/{sess.sid}/resources")
        assert (status, resources["data"]) == (200, [default])
        status, one = await call(gw, "GET", f"/v1/sessions/{sess.sid}/resources/default")
        assert (status, one) == (200, default)
        status, terminals = await call(
            gw, "GET", f"/v1/sessions/{sess.sid}/resources/terminals", query="order=asc&limit=1000"
        )
        assert (status, terminals["data"]) == (200, [])
        # The terminal routes' errors have the 0.19 shape too.
        assert_error(
            await call(gw, "GET", f"/v1/sessions/{sess.sid}/resources/nope"), 404, "not_found"
        )
        assert_error(await call(gw, "POST", f"/v1/sessions/{sess.sid}/resources"), 404, "not_found")
        assert_error(
            await call(gw, "GET", f"/v1/sessions/{sess.sid}/resources", query="limit=0"),
            400,
            "invalid_input",
        )


async def test_environment_default_describes_its_root(ehost, sess) -> None:
    async with fake_gateway(ehost.endpoint) as gw:
        status, env = await call(gw, "GET", f"{sess.env}/default")
        assert status == 200
        assert (env["id"], env["object"], env["type"]) == (
            "default",
            "session.resource",
            "environment",
        )
        meta = env["metadata"]
        assert (meta["environment_type"], meta["role"]) == ("caller_process", "primary")
        assert meta["root"] == str(sess.root)
        assert meta["home"] == os.path.expanduser("~")
        assert meta["reachable"] == {
            "unconfined": False,
            "roots": [{"path": str(sess.root), "access": "write", "origin": "cwd"}],
        }
        message = assert_error(await call(gw, "GET", f"{sess.env}/other"), 404, "not_found")
        assert message == "Environment 'other' not found"
        assert_error(await call(gw, "GET", f"{sess.env}/other/filesystem"), 404, "not_found")
        assert_error(await call(gw, "DELETE", f"{sess.env}/default"), 405, "method_not_allowed")


async def test_filesystem_lists_pages_and_reads(ehost, sess) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (sess.root / name).write_text(f"{name}\n")
    (sess.root / "sub").mkdir()
    (sess.root / "sub" / "inner.py").write_text("print('hi')\n")
    (sess.root / "blob.bin").write_bytes(b"\x00\x01\xff")
    async with fake_gateway(ehost.endpoint) as gw:
        # What the server sends for the root: ``filesystem?limit=20&order=desc``.
        status, root = await call(gw, "GET", sess.fs, query="limit=20&order=desc")
        assert status == 200
        assert root["object"] == "list" and root["base"] == str(sess.root)
        assert [e["id"] for e in root["data"]] == ["sub", "c.txt", "blob.bin", "b.txt", "a.txt"]
        a = root["data"][-1]
        assert a == {
            "id": "a.txt",
            "object": "session.environment.filesystem.entry",
            "name": "a.txt",
            "path": "a.txt",
            "type": "file",
            "bytes": 6,
            "modified_at": int((sess.root / "a.txt").stat().st_mtime),
        }
        assert (root["data"][0]["type"], root["data"][0]["bytes"]) == ("directory", None)
        assert (root["first_id"], root["last_id"], root["has_more"]) == ("sub", "a.txt", False)
        # Pages: asc, two at a time, on from a cursor.
        status, first = await call(gw, "GET", sess.fs, query="order=asc&limit=2")
        assert [e["id"] for e in first["data"]] == ["a.txt", "b.txt"] and first["has_more"]
        status, second = await call(gw, "GET", sess.fs, query="order=asc&limit=2&after=b.txt")
        assert [e["id"] for e in second["data"]] == ["blob.bin", "c.txt"] and second["has_more"]
        status, back = await call(gw, "GET", sess.fs, query="order=asc&limit=2&before=sub")
        assert [e["id"] for e in back["data"]] == ["blob.bin", "c.txt"]
        # A directory path lists it; entry paths are relative to the root.
        status, sub = await call(gw, "GET", f"{sess.fs}/sub", query="scope=reach")
        assert status == 200 and [e["path"] for e in sub["data"]] == ["sub/inner.py"]
        assert sub["base"] == str(sess.root / "sub")
        # A file path reads it.
        status, text = await call(
            gw, "GET", f"{sess.fs}/sub/inner.py", query="limit=20&scope=reach"
        )
        assert (status, text) == (
            200,
            {
                "object": "session.environment.filesystem.file_content",
                "path": "sub/inner.py",
                "content_type": "text/x-python",
                "bytes": 12,
                "truncated": False,
                "encoding": "utf-8",
                "content": "print('hi')\n",
            },
        )
        status, blob = await call(gw, "GET", f"{sess.fs}/blob.bin")
        assert (blob["encoding"], base64.b64decode(blob["content"])) == ("base64", b"\x00\x01\xff")
        for bad in ("limit=0", "limit=1001", "limit=x", "order=up", "scope=all"):
            assert_error(await call(gw, "GET", sess.fs, query=bad), 400, "invalid_input")
        assert_error(await call(gw, "GET", f"{sess.fs}/missing.txt"), 404, "path_not_found")


async def test_reads_and_listings_are_bounded(ehost, sess) -> None:
    (sess.root / "big.log").write_bytes(b"y" * (env_files.MAX_READ_BYTES + 10))
    many = sess.root / "many"
    many.mkdir()
    for i in range(1200):
        (many / f"f{i:04d}").touch()
    async with fake_gateway(ehost.endpoint) as gw:
        status, big = await call(gw, "GET", f"{sess.fs}/big.log")
        assert status == 200 and big["truncated"] is True
        assert big["bytes"] == env_files.MAX_READ_BYTES == len(big["content"])
        status, listed = await call(gw, "GET", f"{sess.fs}/many", query="limit=1000&order=asc")
        assert len(listed["data"]) == 1000 and listed["has_more"] is True
        status, rest = await call(
            gw, "GET", f"{sess.fs}/many", query=f"limit=1000&order=asc&after={listed['last_id']}"
        )
        assert len(rest["data"]) == 200 and rest["has_more"] is False


async def test_paths_stay_inside_the_root(ehost, sess, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("no\n")
    (sess.root / "out").symlink_to(outside)
    (sess.root / "in.txt").write_text("in\n")
    async with fake_gateway(ehost.endpoint) as gw:
        for path in ("..", "../outside/secret.txt", "a/../../outside", "%2E%2E/outside"):
            assert_error(await call(gw, "GET", f"{sess.fs}/{path}"), 400, "invalid_path")
        for path in ("out", "out/secret.txt"):
            message = assert_error(await call(gw, "GET", f"{sess.fs}/{path}"), 400, "invalid_path")
            assert "escapes the environment root" in message
        # The server encodes an absolute path's leading slash as %2F.
        escaped = f"{sess.fs}/%2F{str(outside / 'secret.txt').lstrip('/')}"
        assert_error(await call(gw, "GET", escaped), 403, "path_unreachable")
        inside = f"{sess.fs}/%2F{str(sess.root / 'in.txt').lstrip('/')}"
        status, read = await call(gw, "GET", inside)
        assert (status, read["path"], read["content"]) == (200, "in.txt", "in\n")
        assert_error(await call(gw, "GET", f"{sess.fs}/a%00b"), 400, "invalid_path")
        # Writes and deletes are held to the same rule; the link's target is untouched.
        put = await call(gw, "PUT", f"{sess.fs}/out/new.txt", {"content": "x"})
        assert_error(put, 400, "invalid_path")
        assert_error(
            await call(gw, "DELETE", f"{sess.fs}/../outside", query="recursive=true"),
            400,
            "invalid_path",
        )
        assert_error(await call(gw, "DELETE", sess.fs), 400, "invalid_path")
        # Deleting the link removes the link, not what it points at.
        status, deleted = await call(gw, "DELETE", f"{sess.fs}/out")
        assert (status, deleted["type"]) == (200, "symlink")
    assert (outside / "secret.txt").read_text() == "no\n"
    assert not (outside / "new.txt").exists()


async def test_mutations_answer_their_results_and_publish_the_signal(ehost, sess) -> None:
    async with fake_gateway(ehost.endpoint) as gw:
        assert (await gw.init(sess.sid)).status == 201
        status, wrote = await call(
            gw, "PUT", f"{sess.fs}/notes/a.txt", {"content": "hello\nworld\n", "encoding": "utf-8"}
        )
        assert status == 200
        assert {
            k: wrote[k] for k in ("object", "operation", "path", "created", "bytes_written")
        } == {
            "object": "session.environment.filesystem.write_result",
            "operation": "write",
            "path": "notes/a.txt",
            "created": True,
            "bytes_written": 12,
        }
        assert wrote["entry"]["path"] == "notes/a.txt" and wrote["entry"]["bytes"] == 12
        await gw.wait(lambda: len(invalidations(gw, sess.sid)) == 1)
        assert {k: v for k, v in invalidations(gw, sess.sid)[0].items() if k != "_seq"} == {
            "type": "session.changed_files.invalidated",
            "session_id": sess.sid,
            "environment_id": "default",
        }
        status, edited = await call(
            gw, "PATCH", f"{sess.fs}/notes/a.txt", {"old_text": "world", "new_text": "planet"}
        )
        assert status == 200
        assert {k: edited[k] for k in ("object", "operation", "replacements")} == {
            "object": "session.environment.filesystem.edit_result",
            "operation": "edit",
            "replacements": 1,
        }
        assert (edited["bytes_before"], edited["bytes_after"]) == (12, 13)
        assert (sess.root / "notes" / "a.txt").read_text() == "hello\nplanet\n"
        await gw.wait(lambda: len(invalidations(gw, sess.sid)) == 2)
        status, again = await call(
            gw, "PUT", f"{sess.fs}/notes/b.bin", {"content": "AAH/", "encoding": "base64"}
        )
        assert (status, again["created"]) == (200, True)
        assert (sess.root / "notes" / "b.bin").read_bytes() == b"\x00\x01\xff"
        # Failures: nothing changes, nothing is published.
        conflict = await call(
            gw, "PATCH", f"{sess.fs}/notes/a.txt", {"old_text": "nope", "new_text": ""}
        )
        assert_error(conflict, 409, "edit_conflict")
        assert_error(await call(gw, "DELETE", f"{sess.fs}/notes"), 409, "directory_not_empty")
        on_dir = await call(gw, "PATCH", f"{sess.fs}/notes", {"old_text": "a", "new_text": "b"})
        assert_error(on_dir, 400, "invalid_path")
        assert_error(
            await call(gw, "PUT", f"{sess.fs}/notes", {"content": "x"}), 400, "invalid_path"
        )
        no_parent = await call(
            gw, "PUT", f"{sess.fs}/x/y.txt", {"content": "", "create_parents": False}
        )
        assert_error(no_parent, 404, "path_not_found")
        for body in ({"content": 3}, {"content": "x", "encoding": "latin-1"}, [1]):
            assert_error(await call(gw, "PUT", f"{sess.fs}/bad.txt", body), 400, "invalid_input")
        assert_error(
            await call(gw, "PATCH", f"{sess.fs}/notes/a.txt", {"new_text": "x"}),
            400,
            "invalid_input",
        )
        status, deleted = await call(gw, "DELETE", f"{sess.fs}/notes", query="recursive=true")
        assert status == 200
        assert deleted == {
            "object": "session.environment.filesystem.delete_result",
            "operation": "delete",
            "path": "notes",
            "deleted": True,
            "type": "directory",
            "bytes_deleted": 16,
            "entries_deleted": 3,
        }
        assert not (sess.root / "notes").exists()
        await gw.wait(lambda: len(invalidations(gw, sess.sid)) == 4)
        status, _ = await call(gw, "POST", f"{sess.env}/default/shell", {"command": "touch s.txt"})
        assert status == 200 and (sess.root / "s.txt").exists()
        await gw.wait(lambda: len(invalidations(gw, sess.sid)) == 5)
    assert len(invalidations(gw, sess.sid)) == 5


async def test_search_by_name_and_path(ehost, sess) -> None:
    (sess.root / "src").mkdir()
    (sess.root / "src" / "hello.py").write_text("")
    (sess.root / "src" / "other.py").write_text("")
    (sess.root / "hello.txt").write_text("")
    (sess.root / ".git").mkdir()
    (sess.root / ".git" / "hello").write_text("")
    async with fake_gateway(ehost.endpoint) as gw:
        # What the server sends: ``search?q=hello&limit=500``.
        status, found = await call(
            gw, "GET", f"{sess.env}/default/search", query="q=HELLO&limit=500"
        )
        assert status == 200
        assert [e["path"] for e in found["data"]] == ["hello.txt", "src/hello.py"]
        assert found["object"] == "list" and found["base"] == str(sess.root)
        assert (found["has_more"], found["truncated"]) == (False, False)
        status, under = await call(gw, "GET", f"{sess.env}/default/search/src", query="q=py")
        assert [e["path"] for e in under["data"]] == ["src/hello.py", "src/other.py"]
        assert under["base"] == str(sess.root / "src")
        status, one = await call(gw, "GET", f"{sess.env}/default/search", query="q=py&limit=1")
        assert len(one["data"]) == 1 and one["has_more"] is True
        status, only = await call(
            gw, "GET", f"{sess.env}/default/search", query="q=o&include=*.txt"
        )
        assert [e["path"] for e in only["data"]] == ["hello.txt"]
        status, dropped = await call(
            gw, "GET", f"{sess.env}/default/search", query="q=hello&exclude=src"
        )
        assert [e["path"] for e in dropped["data"]] == ["hello.txt"]
        for bad in ("", "q=%20", "q=a&limit=501"):
            assert_error(
                await call(gw, "GET", f"{sess.env}/default/search", query=bad), 400, "invalid_input"
            )
        assert_error(
            await call(gw, "GET", f"{sess.env}/default/search/nope", query="q=a"),
            404,
            "path_not_found",
        )


async def test_outside_git_changes_are_empty_and_diff_has_nothing_to_compare(ehost, sess) -> None:
    (sess.root / "f.txt").write_text("x")
    async with fake_gateway(ehost.endpoint) as gw:
        status, changes = await call(gw, "GET", f"{sess.env}/default/changes")
        assert (status, changes) == (200, {"object": "list", "data": [], "has_more": False})
        assert_error(await call(gw, "GET", f"{sess.env}/default/diff/f.txt"), 404, "not_found")
        assert_error(await call(gw, "GET", f"{sess.env}/default/diff/../x"), 400, "invalid_path")
        assert_error(await call(gw, "GET", f"{sess.env}/default/diff"), 400, "invalid_path")


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_in_a_git_work_tree_changes_and_diffs_come_from_git(ehost, sess) -> None:
    """As omnigent's runner: ``git status`` under the root, counts from ``numstat``, the
    diff of a file against ``HEAD`` (the root may be a subdirectory of the work tree)."""
    top = sess.root.parent
    root = sess.root
    (root / "kept.txt").write_text("one\ntwo\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "old.txt").write_text("moved\n")
    (top / "elsewhere.txt").write_text("not under the root\n")
    git(top, "init", "-q")
    git(top, "add", ".")
    git(top, "commit", "-qm", "base")
    (root / "kept.txt").write_text("one\n2\nthree\n")
    (root / "gone.txt").unlink()
    git(top, "mv", "workspace/old.txt", "workspace/new.txt")
    (root / "sub").mkdir()
    (root / "sub" / "fresh.txt").write_text("fresh\n")
    (top / "elsewhere.txt").write_text("changed, but not under the root\n")
    async with fake_gateway(ehost.endpoint) as gw:
        status, changes = await call(gw, "GET", f"{sess.env}/default/changes")
        assert status == 200 and changes["has_more"] is False
        by_path = {c["path"]: c for c in changes["data"]}
        assert {p: c["status"] for p, c in by_path.items()} == {
            "kept.txt": "modified",
            "gone.txt": "deleted",
            "new.txt": "modified",
            "sub/fresh.txt": "created",
        }
        kept = by_path["kept.txt"]
        assert kept == {
            "object": "session.environment.filesystem.entry",
            "path": "kept.txt",
            "name": "kept.txt",
            "status": "modified",
            "bytes": 12,
            "modified_at": int((root / "kept.txt").stat().st_mtime),
            "lines_added": 2,
            "lines_removed": 1,
        }
        assert (by_path["gone.txt"]["bytes"], by_path["gone.txt"]["lines_removed"]) == (None, 1)
        assert by_path["sub/fresh.txt"]["lines_added"] is None  # untracked: git has no diff
        status, diff = await call(gw, "GET", f"{sess.env}/default/diff/kept.txt")
        assert (status, diff) == (
            200,
            {
                "object": "session.environment.filesystem.file_diff",
                "path": "kept.txt",
                "before": "one\ntwo\n",
                "after": "one\n2\nthree\n",
            },
        )
        _, gone = await call(gw, "GET", f"{sess.env}/default/diff/gone.txt")
        assert (gone["before"], gone["after"]) == ("bye\n", None)
        _, fresh = await call(gw, "GET", f"{sess.env}/default/diff/sub/fresh.txt")
        assert (fresh["before"], fresh["after"]) == (None, "fresh\n")
        git(top, "add", ".")
        git(top, "commit", "-qm", "all in")
        assert_error(await call(gw, "GET", f"{sess.env}/default/diff/kept.txt"), 404, "not_found")
        _, clean = await call(gw, "GET", f"{sess.env}/default/changes")
        assert clean["data"] == []


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_looking_at_changes_runs_no_program_the_repository_configures(
    ehost, sess, tmp_path
) -> None:
    """A model that may write files (``.git/config``, ``.gitattributes``) must not get a
    command run, unasked, when the user opens the changes: plain ``git status`` would run
    ``core.fsmonitor`` and the clean filter."""
    root = sess.root
    (root / "a.txt").write_text("a\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "base")
    script = tmp_path / "planted.sh"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-$1\ncat\n")
    script.chmod(0o755)
    git(root, "config", "core.fsmonitor", f"{script} fsmonitor")
    git(root, "config", "filter.Evil.clean", f"{script} clean")
    git(root, "config", "filter.Evil.process", f"{script} process")
    (root / ".gitattributes").write_text("* filter=Evil\n")
    (root / "a.txt").write_text("a\nb\n")
    async with fake_gateway(ehost.endpoint) as gw:
        status, changes = await call(gw, "GET", f"{sess.env}/default/changes")
        assert status == 200, changes
        assert {c["path"]: c["status"] for c in changes["data"]} == {
            "a.txt": "modified",
            ".gitattributes": "created",
        }
        status, diff = await call(gw, "GET", f"{sess.env}/default/diff/a.txt")
        assert (status, diff["before"], diff["after"]) == (200, "a\n", "a\nb\n")
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == []


async def test_shell_runs_in_the_root_without_the_hosts_secrets(ehost, sess) -> None:
    async with fake_gateway(ehost.endpoint) as gw:
        command = 'pwd; echo "token=${CORRAL_TEST_ROUTES_TOKEN:-none}"; echo err >&2; exit 3'
        status, result = await call(gw, "POST", f"{sess.env}/default/shell", {"command": command})
        assert status == 200
        assert result == {
            "object": "session.environment.shell_result",
            "stdout": f"{sess.root}\ntoken=none\n",
            "stderr": "err\n",
            "exit_code": 3,
            "timed_out": False,
            "cwd": str(sess.root),
        }
        assert SECRET not in json.dumps(result)
        status, slow = await call(
            gw, "POST", f"{sess.env}/default/shell", {"command": "sleep 30 & wait", "timeout": 1}
        )
        assert (status, slow["timed_out"]) == (200, True)
        for body in (
            {},
            {"command": ""},
            {"command": "ls", "timeout": "5"},
            {"command": "ls", "timeout": 0},
        ):
            assert_error(
                await call(gw, "POST", f"{sess.env}/default/shell", body), 400, "invalid_input"
            )
        assert_error(await call(gw, "GET", f"{sess.env}/default/shell"), 405, "method_not_allowed")


async def test_a_slow_request_does_not_hold_up_the_others(ehost, sess) -> None:
    """Each request runs in a task of its own: a listing answers while a shell runs."""
    async with fake_gateway(ehost.endpoint) as gw, trio.open_nursery() as nursery:
        done = trio.Event()

        async def slow() -> None:
            await call(gw, "POST", f"{sess.env}/default/shell", {"command": "sleep 3"})
            done.set()

        nursery.start_soon(slow)
        groups = ehost.instance.actor_dir("tools") / "groups"
        with trio.fail_after(10):  # the shell's process group is recorded once it runs
            while not any(groups.glob("*.pid")):
                await trio.sleep(0.02)
        with trio.fail_after(2):
            status, _listed = await call(gw, "GET", sess.fs)
        assert status == 200 and not done.is_set()


async def test_t07_the_root_follows_the_spec_the_sessions_tools_ran_with(
    ehost, sess, tmp_path
) -> None:
    """Without a workspace an absolute ``os_env.cwd`` is the root (T-07): the actor learns
    it from the session's tool calls, keeps it across a ``kill -9``, and refuses a sandbox it
    cannot provide (browsing or a shell must not be the way around it)."""
    cwd = (tmp_path / "spec-cwd").resolve()
    cwd.mkdir()
    (cwd / "from-spec.txt").write_text("spec\n")
    spec = {"os_env": {"type": "caller_process", "cwd": str(cwd)}}
    async with fake_gateway(ehost.endpoint) as gw:
        _, before = await call(gw, "GET", f"{sess.env}/default")
        assert before["metadata"]["root"] == str(sess.root)
        result = await gw.peer.call(
            "tools",
            ToolExec(
                session_id=sess.sid,
                call_id=f"call_{uuid.uuid4().hex}",
                name="sys_os_read",
                arguments=json.dumps({"path": "from-spec.txt"}),
                spec=spec,
            ),
            durable=True,
            timeout=30,
        )
        assert json.loads(result.output)["content"] == "spec\n"
        _, after = await call(gw, "GET", f"{sess.env}/default")
        assert after["metadata"]["root"] == str(cwd)
        before_kill = ehost.actor("tools")
        os.kill(before_kill["pid"], signal.SIGKILL)
        await trio.to_thread.run_sync(ehost.restarted, "tools", before_kill)
        _, listed = await call(gw, "GET", sess.fs)
        assert [entry["id"] for entry in listed["data"]] == ["from-spec.txt"]
        sandboxed = {"os_env": {**spec["os_env"], "sandbox": {"type": "darwin_seatbelt"}}}
        await gw.peer.call(
            "tools",
            ToolExec(
                session_id=sess.sid,
                call_id=f"call_{uuid.uuid4().hex}",
                name="sys_os_read",
                arguments="{}",
                spec=sandboxed,
            ),
            durable=True,
            timeout=30,
        )
        for method, path, body in (
            ("GET", sess.fs, None),
            ("POST", f"{sess.env}/default/shell", {"command": "true"}),
        ):
            assert_error(await call(gw, method, path, body), 409, "unsupported_environment")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
async def test_t16_one_terminal_is_read_and_closed_by_its_resource_id(ehost, sess) -> None:
    """The server closes one terminal with ``DELETE .../resources/terminals/{id}``."""
    terminals = f"/v1/sessions/{sess.sid}/resources/terminals"
    async with fake_gateway(ehost.endpoint) as gw:
        assert (await gw.init(sess.sid)).status == 201
        launched = await gw.peer.call(
            "tools",
            ToolExec(
                session_id=sess.sid,
                call_id=f"call_{uuid.uuid4().hex}",
                name="sys_terminal_launch",
                arguments=json.dumps({"terminal": "sh", "session": "s1"}),
                spec={"terminals": {"sh": {"command": "sh"}}},
            ),
            durable=True,
            timeout=30,
        )
        assert json.loads(launched.output)["status"] == "launched"
        status, view = await call(gw, "GET", f"{terminals}/terminal_sh_s1")
        assert (status, view["id"], view["metadata"]["running"]) == (200, "terminal_sh_s1", True)
        _, resources = await call(
            gw, "GET", f"/v1/sessions/{sess.sid}/resources", query="order=asc"
        )
        assert [r["id"] for r in resources["data"]] == ["default", "terminal_sh_s1"]
        status, closed = await call(gw, "DELETE", f"{terminals}/terminal_sh_s1")
        assert (status, closed) == (
            200,
            {"id": "terminal_sh_s1", "object": "session.resource.deleted", "deleted": True},
        )

        def deleted() -> list[dict[str, Any]]:
            events = gw.events.get(sess.sid, [])
            return [e for e in events if e["type"] == "session.resource.deleted"]

        await gw.wait(deleted)
        assert deleted()[0]["resource_id"] == "terminal_sh_s1"
        assert_error(await call(gw, "DELETE", f"{terminals}/terminal_sh_s1"), 404, "not_found")
        assert_error(await call(gw, "PUT", terminals), 405, "method_not_allowed")


async def test_a_download_streams_the_files_bytes(ehost, sess) -> None:
    """``?download=true`` answers the bytes as an attachment, in chunks, as omnigent's
    runner streams them (the server refuses the JSON envelope for a download)."""
    data = os.urandom(600 * 1024)
    (sess.root / "blob.bin").write_bytes(data)
    (sess.root / "naïve file.txt").write_text("x")
    (sess.root / "huge.bin").touch()
    os.truncate(sess.root / "huge.bin", env_files.MAX_DOWNLOAD_BYTES + 1)  # sparse
    async with fake_gateway(ehost.endpoint) as gw:
        request_id = uuid.uuid4().hex
        head = await gw.peer.call(
            "tools",
            HttpRequest(
                request_id=request_id,
                method="GET",
                path=f"{sess.fs}/blob.bin",
                query="download=true&scope=reach",
                reply_to=gw.peer.name,
            ),
            timeout=30,
        )
        assert (head.status, head.streaming, head.body) == (200, True, b"")
        assert dict(head.headers) == {
            "content-type": "application/octet-stream",
            "content-length": str(len(data)),
            "content-disposition": 'attachment; filename="blob.bin"',
            "cache-control": "no-store",
            "x-content-type-options": "nosniff",
        }
        await gw.wait(lambda: request_id in gw.ended)
        assert b"".join(gw.chunks[request_id]) == data
        assert len(gw.chunks[request_id]) > 2  # in pieces, not one bus message
        other = uuid.uuid4().hex
        head = await gw.peer.call(
            "tools",
            HttpRequest(
                request_id=other,
                method="GET",
                path=f"{sess.fs}/na%C3%AFve%20file.txt",
                query="download=true",
                reply_to=gw.peer.name,
            ),
            timeout=30,
        )
        disposition = dict(head.headers)["content-disposition"]
        assert disposition == "attachment; filename*=utf-8''na%C3%AFve%20file.txt"
        await gw.wait(lambda: other in gw.ended)
        too_big = await call(gw, "GET", f"{sess.fs}/huge.bin", query="download=true")
        assert_error(too_big, 413, "file_too_large")
        assert_error(await call(gw, "GET", sess.fs, query="download=true"), 400, "invalid_path")
        assert_error(await call(gw, "GET", sess.fs, query="download=maybe"), 400, "invalid_input")
