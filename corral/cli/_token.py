"""``corral token`` and ``corral token rotate``: the control plane's client credential.

The token lives in ``<state dir>/server/client_token`` (0600, in the 0700 server dir); every
client call of the control plane sends it as ``Authorization: Bearer`` (docs/security.md).
``corral token`` prints it, for a user or a machine that cannot read the state dir
(``CORRAL_TOKEN=… corral send --url URL …``). ``corral token rotate`` writes a new one in
its place: a running control plane refuses the old one from its next request on, and keeps
serving.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..config import resolve_state_dir
from ._locate import NoCredential, client_token_file, read_client_token
from ._output import CliError, emit_json, json_option, state_dir_option


def _state(state_dir: Path | None) -> Path:
    return resolve_state_dir(str(state_dir) if state_dir else None)


def _print(token: str, path: Path, as_json: bool, **extra: object) -> None:
    if as_json:
        emit_json({"token": token, "path": str(path), **extra})
    else:
        click.echo(token)


@click.group("token", invoke_without_command=True)
@state_dir_option
@json_option
@click.pass_context
def token_group(ctx: click.Context, state_dir: Path | None, as_json: bool) -> None:
    """Print the control plane's client token (with --json: {token, path}).

    Clients send it as `Authorization: Bearer <token>`; `corral agents/send/chat` read it
    from the state dir themselves. From another user or machine:
    `CORRAL_TOKEN=<token> corral send --url http://127.0.0.1:PORT ...`.

    \b
    Example:
        corral token
        corral token rotate --json
    """
    if ctx.invoked_subcommand is not None:
        return
    directory = _state(state_dir)
    try:
        token = read_client_token(directory)
    except NoCredential as exc:
        raise CliError(str(exc), code="no_credential") from None
    _print(token, client_token_file(directory), as_json)


@token_group.command("rotate")
@state_dir_option
@json_option
def rotate_command(state_dir: Path | None, as_json: bool) -> None:
    """Replace the client token with a new one and print it; the old one is refused from
    now on, and a running host keeps serving."""
    # Imported here: the control plane's package is heavy, and only this command writes.
    from ..server._plane._credential import rotate_client_token

    directory = _state(state_dir)
    path = client_token_file(directory)
    try:
        token = rotate_client_token(path.parent)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}", code="write_failed") from None
    _print(token, path, as_json, rotated=True)
