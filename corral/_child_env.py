"""What a child process of a host may see of the host: its environment, and its sandbox.

**The allow-list.** Harness workers, tool shells and terminals start with
:func:`base_env`, a short allow-list of the host's environment and nothing else of it, so
the host's secrets (API keys, tunnel tokens, cloud credentials) never reach them. An actor
starts with :func:`actor_env`: the same list plus corral's own non-secret settings.

**Hidden variables.** Any process of the same user (and root) can read another's
``/proc/PID/environ``, which shows the environment the process was exec'd with, whatever it
did to ``os.environ`` since. So a variable a child needs but no one else may read — an
actor's spec with the runner tokens in it, the host's variables the harness actor expands
``$VAR`` from, a worker's resolved API key — never goes into its environ block. The spawner
names such variables in :data:`HIDDEN_ENV`; :func:`split_hidden` takes them out, the spawn
(:func:`corral.actors._process.spawn`) writes them to a memfd the child inherits, and the
child's first act, :func:`take_hidden_env`, reads them into its ``os.environ`` and closes the
memfd. Until then (the interpreter's start-up) the memfd is open, and readable through
``/proc/PID/fd`` by the same user.

**The host's own environ.** :func:`blank_environ_block` overwrites, in place, the entries of
the host's environ block that are not on the allow-list, after Python copied them into
``os.environ``: ``/proc/<host pid>/environ`` then shows them as empty strings. The host, which
holds every secret in memory, also makes itself :func:`non_dumpable`, so that another process
of its user can neither read its memory nor ptrace it (root can).

**The sandbox.** An agent spec's ``os_env.sandbox`` of a Linux type (:data:`SANDBOX_TYPES`)
asks for bubblewrap; :func:`sandbox_of` reads it, and :func:`sandbox_refusal` says why this
host cannot honour it (bubblewrap not on ``PATH``, a field it cannot enforce). The harness
actor checks it before a turn starts and the tools before anything runs, so a spec that asks
for a sandbox never runs without one. How a command is wrapped is
:mod:`corral.tools.sandbox`.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass

_ALLOWED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    # Where the coding-agent CLIs are (corral.clis): the gateway, the tools and the workers
    # all look for them, and a path holds no secret.
    "CORRAL_CLI_PATH",
)

#: What an actor needs of the host's environment besides :data:`_ALLOWED`: corral's own
#: settings that hold no secret (the log level and format, where the tools work, where omnigent's
#: config file with the model providers ``sys_list_models`` reads is).
_ACTOR_ALLOWED = (
    "CORRAL_LOG_LEVEL",
    "CORRAL_LOG",
    "CORRAL_WORKSPACE",
    "OMNIGENT_RUNNER_WORKSPACE",
    "CORRAL_OS_ENV_ROOT",
    "OMNIGENT_RUNNER_OS_ENV_ROOT",
    "OMNIGENT_CONFIG_HOME",
    # Which of its inherited fds is the seed socket (corral._zygote._seed): no secret, and
    # only a process forked with the socket open holds it.
    "CORRAL_SEED",
)

#: What an actor that makes HTTP requests needs to reach its servers (a proxy URL may hold a
#: password, so these are handed over hidden).
NETWORK_VARS = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)

#: In an env a spawner builds: the names (a JSON list) that reach the child hidden.
HIDDEN_ENV = "CORRAL_HIDDEN_ENV"
#: In a child's environ: the memfd its hidden variables are in.
HIDDEN_ENV_FD = "CORRAL_HIDDEN_ENV_FD"


#: In a zygote's environ: blank room each child forked from it overwrites with its own
#: environment (:func:`corral._zygote._template.show_environ`).
RESERVE_ENV = "CORRAL_ZYGOTE_RESERVE"
#: How much room (bytes): a worker's environment is a few kB.
RESERVE_BYTES = 64 * 1024
#: The reserve, as it goes into the environment of an exec'd zygote or of the clean exec of
#: ``corral up`` (whose pages the seed's line shares).
RESERVE: Mapping[str, str] = {RESERVE_ENV: "x" * RESERVE_BYTES}
#: In a ``corral up`` exec'd again by :func:`reexec_clean`: its pid (an exec keeps it), so
#: that a child that inherits the variable is not taken for one.
CLEAN_ENV = "CORRAL_UP_CLEAN"
#: What the environ block of the clean exec keeps besides the actors' allow-list: the state
#: dir and config the host itself keeps there, and what sets up the interpreter and its loader.
_CLEAN_KEPT = ("CORRAL_STATE_DIR", "CORRAL_CONFIG")
_CLEAN_KEPT_PREFIXES = ("PYTHON", "LD_")


def base_env(host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of the host's environment."""
    source = os.environ if host_env is None else host_env
    return {k: source[k] for k in _ALLOWED if k in source}


def actor_env(host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What an actor's environ holds of the host's environment: :func:`base_env` and
    corral's non-secret settings."""
    source = os.environ if host_env is None else host_env
    return {k: source[k] for k in (*_ALLOWED, *_ACTOR_ALLOWED) if k in source}


def spec_variables(host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What ``$VAR`` in an agent spec may name: the host's environment but what
    :func:`actor_env` holds and corral's own ``CORRAL_*`` settings (the runner token is the
    host's, never an agent's key)."""
    source = os.environ if host_env is None else host_env
    shown = {*_ALLOWED, *_ACTOR_ALLOWED}
    return {k: v for k, v in source.items() if k not in shown and not k.startswith("CORRAL_")}


def hide(env: Mapping[str, str], hidden: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus ``hidden``, each of which the spawn hands over through a memfd."""
    names = json.loads(env.get(HIDDEN_ENV, "[]"))
    return {**env, **hidden, HIDDEN_ENV: json.dumps([*names, *hidden])}


def split_hidden(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` as (the environ block, the hidden variables): the names :data:`HIDDEN_ENV`
    lists (a JSON list) go to the second."""
    names = set(json.loads(env.get(HIDDEN_ENV, "[]")))
    shown = {k: v for k, v in env.items() if k not in names and k != HIDDEN_ENV}
    return shown, {k: v for k, v in env.items() if k in names}


def hand_over(hidden: Mapping[str, str]) -> int:
    """A memfd holding ``hidden`` (JSON), at offset 0 and inheritable; the caller closes it
    once the child is spawned."""
    fd = os.memfd_create("corral-hidden-env", 0)
    with os.fdopen(fd, "wb", closefd=False) as file:
        file.write(json.dumps(dict(hidden)).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def clean_env(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``environ`` split as :func:`reexec_clean` execs: (the environ block, the variables
    handed over hidden). The block holds no secret: the actors' allow-list, the state dir
    and config, and the interpreter's and loader's settings (``PYTHON*``, ``LD_*``)."""
    names = {*actor_env(environ), *_CLEAN_KEPT}
    shown = {k: v for k, v in environ.items() if k in names or k.startswith(_CLEAN_KEPT_PREFIXES)}
    hidden = {k: v for k, v in environ.items() if k not in shown and k != CLEAN_ENV}
    return shown, hidden


def reexec_clean() -> None:
    """Exec this process (``corral up``) again with its secrets out of the new process's
    memory until it takes them (:func:`take_hidden_env`, after it forked the seed,
    :func:`corral._zygote.fork_seed`): every variable :func:`clean_env` does not show goes to
    a memfd. Does nothing in the process it exec'd; returns when the exec fails (the host
    then runs without a seed)."""
    if os.environ.get(CLEAN_ENV) == str(os.getpid()):
        return
    shown, hidden = clean_env(os.environ)
    fd = hand_over(hidden)
    env = {
        **shown,
        HIDDEN_ENV_FD: str(fd),
        CLEAN_ENV: str(os.getpid()),
        **RESERVE,  # room a worker forked from the seed's line overwrites with its own
    }
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError as exc:
        os.close(fd)
        print(f"corral up: could not exec itself clean (no seed): {exc}", file=sys.stderr)


def take_hidden_env() -> None:
    """Move the variables the spawner handed over hidden into ``os.environ`` (the child's
    first act: the memfd is closed once read)."""
    raw = os.environ.pop(HIDDEN_ENV_FD, None)
    if raw is None:
        return
    fd = int(raw)
    try:
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read()
    finally:
        os.close(fd)
    os.environ.update(json.loads(data))


def blank_environ_block(keep: Collection[str]) -> list[str]:
    """Overwrite with NULs, in this process's own memory, every entry of its initial environ
    block whose name is not in ``keep``; return the names blanked.

    ``/proc/PID/environ`` reads that block (its bounds are ``env_start``/``env_end`` of
    ``/proc/PID/stat``), not ``os.environ``: changing ``os.environ`` hides nothing. Python
    has copied the block into ``os.environ`` at start, so the values stay usable here; the C
    ``environ`` array still points into the block, at what are now empty strings, which
    ``getenv`` never matches.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        with open("/proc/self/environ", "rb") as file:
            block = file.read()
    except OSError:
        return []
    # After the command name, env_start and env_end are fields 50 and 51 of stat(5).
    start, end = int(fields[47]), int(fields[48])
    if end - start != len(block):
        return []
    blanked = []
    offset = 0
    for entry in block.split(b"\0"):
        name = entry.partition(b"=")[0].decode(errors="replace")
        if entry and name not in keep:
            ctypes.memset(start + offset, 0, len(entry))
            blanked.append(name)
        offset += len(entry) + 1
    return blanked


def non_dumpable() -> bool:
    """Make this process's ``/proc/PID/environ``, ``mem``, ``maps`` and ``fd`` unreadable to
    other processes of its user, and ptrace by them impossible (``PR_SET_DUMPABLE`` 0: the
    kernel then treats it like a setuid program). Root still reads them. False where the
    call is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(4, 0, 0, 0, 0) == 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        return False


# -- the sandbox ----------------------------------------------------------------------------

#: ``os_env.sandbox.type`` values this runner honours on Linux, with bubblewrap.
SANDBOX_TYPES = ("linux_bwrap", "bwrap", "bubblewrap", "os_sandbox")
#: ``os_env.sandbox.type`` values that mean "no sandbox".
NO_SANDBOX: frozenset[object] = frozenset({None, "", "none"})


@dataclass(frozen=True, slots=True)
class Sandbox:
    """An ``os_env.sandbox`` this runner honours: what the sandboxed command may reach
    besides its working directory (writable) and the system's programs (read-only)."""

    allow_network: bool = False
    #: More directories or files to show read-only (``~`` expanded).
    read_paths: tuple[str, ...] = ()
    #: More directories to show writable (relative ones are under the working directory).
    write_paths: tuple[str, ...] = ()
    #: Files to show writable.
    write_files: tuple[str, ...] = ()


class SandboxRefused(ValueError):
    """The spec asks for a sandbox this host cannot provide; nothing runs."""


def sandbox_of(os_env: object) -> Sandbox | None:
    """The sandbox an ``os_env`` mapping asks for; None when it asks for none.

    Raises:
        SandboxRefused: a type this runner does not honour, or a field it cannot enforce.
    """
    if not isinstance(os_env, Mapping):
        return None
    raw = os_env.get("sandbox")
    kind = raw.get("type") if isinstance(raw, Mapping) else raw
    if kind in NO_SANDBOX:
        return None
    if kind not in SANDBOX_TYPES:
        raise SandboxRefused(
            f"os_env.sandbox type {kind!r} is not supported by this runner "
            f"(on Linux: {', '.join(SANDBOX_TYPES)}); refusing to run without the sandbox "
            "the spec asks for"
        )
    fields = raw if isinstance(raw, Mapping) else {}
    if fields.get("egress_rules"):
        raise SandboxRefused(
            "os_env.sandbox.egress_rules cannot be enforced by this runner (its sandbox has "
            "all of the network or none: allow_network); refusing to run"
        )

    def paths(name: str) -> tuple[str, ...]:
        value = fields.get(name) or []
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise SandboxRefused(f"os_env.sandbox.{name} must be a list of paths")
        return tuple(value)

    return Sandbox(
        allow_network=fields.get("allow_network") is True,
        read_paths=paths("read_paths"),
        write_paths=paths("write_paths"),
        write_files=paths("write_files"),
    )


def bwrap_path(path: str | None = None) -> str | None:
    """Where bubblewrap is: ``bwrap`` on ``path`` (this process's ``PATH`` by default)."""
    return shutil.which("bwrap", path=os.environ.get("PATH") if path is None else path)


def sandbox_refusal(os_env: object) -> str | None:
    """Why this host cannot run ``os_env``'s sandbox, or None when it asks for none or can."""
    try:
        sandbox = sandbox_of(os_env)
    except SandboxRefused as exc:
        return str(exc)
    if sandbox is None:
        return None
    if not sys.platform.startswith("linux"):
        return f"os_env.sandbox needs Linux and bubblewrap; this host is {sys.platform}"
    if bwrap_path() is None:
        return (
            "os_env.sandbox needs bubblewrap, which is not installed on this host (no "
            "`bwrap` on PATH; Debian/Ubuntu: apt-get install bubblewrap); refusing to run "
            "without the sandbox the spec asks for"
        )
    return None
