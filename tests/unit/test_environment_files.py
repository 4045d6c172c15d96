"""The environment routes' file work and paging, without a host (PROTOCOL_0_19.md §H)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from corral.tools import env_files
from corral.tools.env_changes import _parse_numstat, _parse_status
from corral.tools.env_files import FsError, resolve, search, split_globs
from corral.tools.environment import Environments, RouteError, SessionSpecs, page


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path.resolve()


# -- containment ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "rel"),
    [("", ""), (".", ""), ("a/b.txt", "a/b.txt"), ("a/../b.txt", "b.txt"), ("./a//b", "a/b")],
)
def test_paths_inside_the_root_resolve(root: Path, path: str, rel: str) -> None:
    target = resolve(root, path)
    assert (target.rel, target.real) == (rel, str(root / rel) if rel else str(root))


def test_an_absolute_path_inside_the_root_is_reported_relative(root: Path) -> None:
    assert resolve(root, str(root / "x" / "y")).rel == "x/y"


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("..", 400, "invalid_path"),
        ("../x", 400, "invalid_path"),
        ("a/../../x", 400, "invalid_path"),
        ("out/secret", 400, "invalid_path"),
        ("dangling", 400, "invalid_path"),
        ("/etc/passwd", 403, "path_unreachable"),
        ("a\x00b", 400, "invalid_path"),
    ],
)
def test_paths_out_of_the_root_are_refused(
    root: Path, tmp_path: Path, path: str, status: int, code: str
) -> None:
    (root / "out").symlink_to(tmp_path)
    (root / "dangling").symlink_to(tmp_path / "not-yet")
    with pytest.raises(FsError) as caught:
        resolve(root, path)
    assert (caught.value.status, caught.value.code) == (status, code)


def test_an_absolute_path_through_an_inside_link_that_leaves_is_refused(
    root: Path, tmp_path: Path
) -> None:
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(FsError, match="escapes the environment root") as caught:
        resolve(root, str(root / "out" / "x"))
    assert caught.value.status == 400


def test_a_delete_does_not_follow_the_last_component(root: Path, tmp_path: Path) -> None:
    (root / "link").symlink_to(tmp_path / "elsewhere.txt")
    target = resolve(root, "link", follow_last=False)
    assert target.real == str(root / "link")
    result = env_files.delete_path(root, "link", recursive=False)
    assert (result["type"], result["bytes_deleted"]) == ("symlink", 0)
    assert not (root / "link").is_symlink()


def test_a_link_out_of_the_root_is_named_not_described(root: Path, tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * 1000)
    (root / "out.bin").symlink_to(tmp_path / "big.bin")
    (root / "real.txt").write_text("abc")
    (root / "in.txt").symlink_to(root / "real.txt")
    listed = env_files.list_or_read(root, "", limit=20, order="asc", after=None, before=None)
    by_name = {e["name"]: e for e in listed["data"]}
    assert (by_name["out.bin"]["type"], by_name["out.bin"]["bytes"]) == ("symlink", None)
    assert (by_name["in.txt"]["type"], by_name["in.txt"]["bytes"]) == ("file", 3)


# -- bounds -----------------------------------------------------------------------------------


def test_a_directory_too_large_to_list_is_413(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(env_files, "MAX_DIR_ENTRIES", 5)
    for i in range(6):
        (root / f"f{i}").touch()
    with pytest.raises(FsError) as caught:
        env_files.list_or_read(root, "", limit=20, order="asc", after=None, before=None)
    assert (caught.value.status, caught.value.code) == (413, "too_large")


def test_a_listing_page_stays_under_the_body_cap(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(env_files, "MAX_BODY_BYTES", 2000)
    for i in range(50):
        (root / f"{i:02d}-{'n' * 40}").touch()
    listed = env_files.list_or_read(root, "", limit=1000, order="asc", after=None, before=None)
    assert 0 < len(listed["data"]) < 50 and listed["has_more"] is True


def test_a_search_stops_at_its_time_budget(root: Path) -> None:
    for i in range(10):
        (root / f"match{i}").touch()
    ticks = itertools.count(step=env_files.SEARCH_TIME_BUDGET_S / 4)
    found = search(root, "", "match", limit=500, clock=lambda: next(ticks))
    assert found["truncated"] is True and len(found["data"]) < 10


def test_a_search_stops_at_its_scan_budget(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(env_files, "SEARCH_SCAN_BUDGET", 3)
    for i in range(10):
        (root / f"m{i}").touch()
    found = search(root, "", "m", limit=500)
    assert found["truncated"] is True and len(found["data"]) == 3


def test_an_edit_over_the_limit_is_413(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(env_files, "MAX_EDIT_BYTES", 10)
    (root / "f.txt").write_text("a" * 11)
    with pytest.raises(FsError) as caught:
        env_files.edit_file(root, "f.txt", "a", "b", replace_all=True)
    assert (caught.value.status, caught.value.code) == (413, "file_too_large")
    assert (root / "f.txt").read_text() == "a" * 11


def test_a_cut_read_drops_a_split_character_and_stays_text(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(env_files, "MAX_READ_BYTES", 4)
    (root / "euro.txt").write_text("\u20ac\u20ac")  # 6 bytes: the cut falls inside the 2nd
    read = env_files.list_or_read(root, "euro.txt", limit=20, order="asc", after=None, before=None)
    assert (read["encoding"], read["content"], read["truncated"]) == ("utf-8", "\u20ac", True)


# -- globs ------------------------------------------------------------------------------------


def test_glob_lists_split_on_top_level_commas() -> None:
    assert split_globs("*.{js,ts}, src/** ,,") == ["*.{js,ts}", "src/**"]
    assert split_globs(None) == split_globs("") == []


@pytest.mark.parametrize(
    ("include", "expected"),
    [
        ("*.{py,md}", ["a/b.py", "a/c.md", "top.py"]),
        ("a/**", ["a/b.py", "a/c.md", "a/d.txt"]),
        ("**/d.txt", ["a/d.txt"]),
        ("top.*", ["top.py"]),
    ],
)
def test_search_includes_by_glob(root: Path, include: str, expected: list[str]) -> None:
    (root / "a").mkdir()
    for name in ("a/b.py", "a/c.md", "a/d.txt", "top.py"):
        (root / name).touch()
    found = search(root, "", ".", limit=500, include=split_globs(include))
    assert [e["path"] for e in found["data"]] == expected


def test_an_excluded_directory_is_not_walked(root: Path) -> None:
    (root / "node_modules" / "x").mkdir(parents=True)
    (root / "node_modules" / "x" / "hit.js").touch()
    (root / "hit.js").touch()
    found = search(root, "", "hit", limit=500, exclude=["**/node_modules"])
    assert [e["path"] for e in found["data"]] == ["hit.js"]


# -- pages ------------------------------------------------------------------------------------


ITEMS = [{"id": name} for name in ("a", "b", "c", "d")]


@pytest.mark.parametrize(
    ("kwargs", "ids", "has_more"),
    [
        ({}, ["d", "c", "b", "a"], False),
        ({"order": "asc", "limit": 2}, ["a", "b"], True),
        ({"order": "asc", "limit": 2, "after": "b"}, ["c", "d"], False),
        ({"order": "asc", "limit": 2, "before": "d"}, ["b", "c"], True),
        ({"order": "asc", "after": "zz"}, ["a", "b", "c", "d"], False),
    ],
)
def test_pages_follow_omnigents_cursor_rules(kwargs, ids: list[str], has_more: bool) -> None:
    got = page(ITEMS, **kwargs)
    assert [item["id"] for item in got["data"]] == ids
    assert (got["first_id"], got["last_id"], got["has_more"]) == (ids[0], ids[-1], has_more)


# -- the root of a session ----------------------------------------------------------------------


def environments(tmp_path: Path, workspace: Path | None) -> Environments:
    return Environments(
        workspace=workspace,
        os_env_root=tmp_path / "fallback",
        specs=SessionSpecs(tmp_path / "specs"),
        timeout_s=30.0,
        max_output_chars=1000,
    )


async def test_t06_the_workspace_wins_over_an_absolute_spec_cwd(tmp_path: Path) -> None:
    envs = environments(tmp_path, tmp_path / "ws")
    await envs.specs.learn("s1", {"os_env": {"cwd": str(tmp_path / "spec")}})
    assert await envs.root("s1") == tmp_path / "ws"
    assert not (tmp_path / "fallback").exists()


async def test_t08_a_placeholder_cwd_is_the_workspace(tmp_path: Path) -> None:
    envs = environments(tmp_path, tmp_path / "ws")
    await envs.specs.learn("s1", {"os_env": {"type": "caller_process", "cwd": "."}})
    assert await envs.root("s1") == tmp_path / "ws"


async def test_t10_without_workspace_or_spec_the_session_gets_its_own_directory(
    tmp_path: Path,
) -> None:
    envs = environments(tmp_path, None)
    root = await envs.root("conv/default workspace")
    assert root == tmp_path / "fallback" / "conv_default_workspace" / "workspace"
    assert root.is_dir()


async def test_an_unsupported_environment_is_409(tmp_path: Path) -> None:
    envs = environments(tmp_path, tmp_path / "ws")
    await envs.specs.learn("s1", {"os_env": {"sandbox": {"type": "darwin_seatbelt"}}})
    with pytest.raises(RouteError) as caught:
        await envs.root("s1")
    assert (caught.value.status, caught.value.code) == (409, "unsupported_environment")


async def test_only_os_env_is_kept_and_it_survives_a_new_instance(tmp_path: Path) -> None:
    specs = SessionSpecs(tmp_path / "specs")
    spec = {
        "os_env": {"cwd": "/srv/x"},
        "executor": {"auth": {"api_key": "sk-secret"}},
    }
    await specs.learn("s1", spec)
    again = SessionSpecs(tmp_path / "specs")
    assert await again.get("s1") == {"os_env": {"cwd": "/srv/x"}}
    assert await again.get("unknown") == {}
    stored = "".join(p.read_text() for p in (tmp_path / "specs").iterdir())
    assert "sk-secret" not in stored and json.loads(stored) == {"os_env": {"cwd": "/srv/x"}}


# -- git's answers ------------------------------------------------------------------------------


def test_git_status_records_are_read_relative_to_the_root() -> None:
    out = b"R  ws/new.txt\0ws/old.txt\0?? ws/a b.txt\0 D ws/gone\0A  ws/added\0MM other/x\0"
    assert _parse_status(out, "ws/") == [
        ("new.txt", "modified"),
        ("a b.txt", "created"),
        ("gone", "deleted"),
        ("added", "created"),
    ]


def test_git_numstat_counts_and_binaries() -> None:
    out = b"3\t1\tsrc/app.py\0-\t-\tlogo.png\0"
    assert _parse_numstat(out) == {"src/app.py": (3, 1), "logo.png": (None, None)}
