"""`fit(torch.compile(module))`: train the module itself, with the forward that `self(x)` runs compiled.

`torch.compile(module)` returns an `OptimizedModule` that wraps the module without being one of its class, and whose
`state_dict()` keys carry an `_orig_mod.` prefix. The Trainer unwraps it (`unwrap_compiled`): hooks, logging and
checkpoints see the user's module, so checkpoint keys are the plain ones. The wrapper's compile context (the
`dynamo_ctx` that holds everything the user passed: backend, mode, options, fullgraph, dynamic) is kept and applied
again, by the strategy, after it has moved and wrapped the module (`compile_forward`), and taken off when the run
ends (`restore_forward`), so the user's module object is left as it was given.

Why the forward and not the whole wrapped step: `training_step` & co. call `self.log`, touch the Trainer and take a
changing `batch_idx`; compiling them would break the graph at each of those or recompile as they change. The forward
is the tensor work. Inside DDP's forward the compiled frames get DDP's bucket-aware graph splitting (dynamo sees the
active DDP module), and FSDP2's hooks are excluded from dynamo and run between graphs, so this one place to compile
fits every strategy that keeps the module's own `__call__` (all but DataParallel, whose replicas copy the module).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from torch import nn

from strategies.exceptions import MisconfigurationError

Compiler = Callable[[Callable[..., Any]], Callable[..., Any]]
_MARK = "_compiled_by_trainer"  # set on the compiled function, to tell it from a forward the user set


def unwrap_compiled(obj: Any) -> tuple[Any, Compiler | None]:
    """`(module, compile context)` for a `torch.compile`d module, `(obj, None)` for anything else."""
    dynamo = sys.modules.get("torch._dynamo")  # nothing can be compiled before dynamo is imported: don't import it
    if dynamo is None or not isinstance(obj, dynamo.OptimizedModule):
        return obj, None
    return obj._orig_mod, obj.dynamo_ctx


def compile_forward(module: nn.Module, compiler: Compiler) -> None:
    """Make `module(x)` (and `module.forward(x)`) run `compiler(forward)`, bound to this module.

    The class's function is compiled and bound again (not the bound method): a deep copy of the module (an averaged
    model, for instance) then binds the compiled forward to the copy, not to this module.

    Raises:
        MisconfigurationError: the module has a `forward` of its own set on the instance (not one we compiled).
    """
    if "forward" in vars(module) and not _compiled_here(module):
        raise MisconfigurationError(
            f"{type(module).__name__} has a `forward` attribute set on the instance; the Trainer compiles the "
            "class's forward. Define forward in the class to train it compiled."
        )
    compiled = compiler(type(module).forward)
    compiled.__dict__[_MARK] = True
    module.forward = types.MethodType(compiled, module)


def restore_forward(module: nn.Module) -> None:
    """Undo `compile_forward`: the class's own forward again (nothing to do on a module it did not compile)."""
    if _compiled_here(module):
        del vars(module)["forward"]


def _compiled_here(module: nn.Module) -> bool:
    own = vars(module).get("forward")
    return isinstance(own, types.MethodType) and getattr(own.__func__, "__dict__", {}).get(_MARK, False)
