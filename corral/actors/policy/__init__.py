"""The policy actor: the gate every tool call of a turn passes.

The actor and what it handles are described in :mod:`corral.actors.policy._actor`.
"""

from ._actor import ParkedCall as ParkedCall
from ._actor import PolicyActor as PolicyActor
from ._actor import PolicyError as PolicyError
from ._actor import PolicyOptions as PolicyOptions
from ._actor import evaluate_elicitation_id as evaluate_elicitation_id
from ._actor import parse_verdict as parse_verdict
