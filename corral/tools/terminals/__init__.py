"""tmux-backed terminals: ``sys_terminal_launch|send|read|list|close`` (T-12..T-16).

An agent spec's ``terminals:`` block names the terminals an agent may open and the command
each runs. The model launches one under a *session key* (``{"terminal": "zsh", "session":
"s1"}``; the key defaults to ``main``), types into it, reads its screen and closes it. Each
launched terminal is a tmux session; clients see it as a session resource
``terminal_<terminal>_<session>`` (PROTOCOL_FACTS §ii.5) and may attach to it through the
``tmux_socket``/``tmux_target`` in its metadata.

Design notes:

* **One tmux server per (conversation, terminal)**, on a socket named by a digest of the
  pair, so conversations never see each other's terminals and the tmux session name can be
  the session key itself (``tmux_target`` is ``s1``, as in the reference runner). Unix
  socket paths are limited to about 100 bytes: the sockets live in the manager's directory
  when that is short enough, else in a private ``0700`` directory under ``/tmp`` named after
  it.
* **No shell, ever.** Every tmux call is an argv list run by :func:`trio.run_process` under
  a deadline. The terminal's command is handed to tmux as several arguments (so tmux does
  not call ``sh -c`` with it) behind ``/bin/sh -c 'exec "$0" "$@"'``, which execs it as
  given; model text reaches the terminal through ``send-keys -l``, literally.
* **Stale servers.** tmux servers daemonise, so a tools actor that crashed leaves them
  running. :meth:`Terminals.run` kills every server of an earlier incarnation at start (and
  reports their resources as deleted); a graceful stop calls :meth:`Terminals.aclose`.
* ``remain-on-exit`` is on: when the command exits, its last screen stays readable and the
  resource says ``running: false`` until the terminal is closed or launched again.

Modules: ``_spec`` (the spec's ``terminals:`` block), ``_resources`` (the session-resource
views), ``_tmux`` (tmux calls and the socket directory), ``_upkeep`` (stale servers at start,
the activity watcher, the graceful stop), ``_manager`` (:class:`Terminals`: the operations),
``_tools`` (the five tools, ``TOOLS``).
"""

from ._manager import DEFAULT_READ_LINES as DEFAULT_READ_LINES
from ._manager import DEFAULT_TRANSPORT as DEFAULT_TRANSPORT
from ._manager import MAX_READ_LINES as MAX_READ_LINES
from ._manager import MAX_SEND_CHARS as MAX_SEND_CHARS
from ._manager import SessionPublish as SessionPublish
from ._manager import Terminals as Terminals
from ._resources import TerminalInstance as TerminalInstance
from ._resources import deleted_event as deleted_event
from ._resources import resource_id as resource_id
from ._resources import resource_view as resource_view
from ._spec import TerminalDef as TerminalDef
from ._spec import parse_terminals as parse_terminals
from ._tools import DEFAULT_SESSION as DEFAULT_SESSION
from ._tools import TOOLS as TOOLS
