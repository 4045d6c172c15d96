"""A zygote: a template process that has imported a runtime and forks children from it.

Harness workers are forked from one (issue #20), and the host's actors from another, which
``corral up`` forks from the host itself: a child then shares the interpreter and every module
the zygote imported, page for page, instead of paying a whole interpreter of its own, and it
starts without importing anything. The harness actor's zygotes are forked by the seed
(:mod:`._seed`), a template ``corral up`` forks before it holds a secret. :mod:`._template`
is the zygote process and why forking from it is safe; :mod:`._client` is its owner's side,
a spawn that forks when it can and execs when it cannot.
"""

from ._client import HTTP_CLIENT_MODULES as HTTP_CLIENT_MODULES
from ._client import Forked as Forked
from ._client import Zygote as Zygote
from ._seed import drop_seed as drop_seed
from ._seed import fork_seed as fork_seed
from ._seed import seed_fd as seed_fd
from ._seed import seed_status as seed_status
from ._template import FORKED_TITLE_PREFIX as FORKED_TITLE_PREFIX
