"""Runner-local tools: the OS-environment tools, terminals, the inbox and async calls.

The tools themselves are plain async functions over a :class:`~corral.tools._api.ToolContext`
(``corral.tools.os_tools``, ``corral.tools.terminals``, ``corral.tools.async_calls``);
:mod:`corral.tools.registry` gathers them into the runner-local dispatch table. The tools
actor (``corral.actors.tools``) runs them; the policy actor (``corral.actors.policy``)
decides whether a call may run. Nothing here imports ``corral.actors``.
"""
