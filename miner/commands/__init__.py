"""One module per ``miner`` verb (see ``miner.cli``)."""

from __future__ import annotations


def interpret_on_cpu(verb: str) -> None:
    """``--allow-cpu`` on a machine without CUDA: Triton kernels run in the interpreter, which must be
    switched on before triton is imported, and the fusions fire on the CPU only when asked
    (``MINER_INTERPRET=1``, ``miner.runtime.fusions``). No-op where CUDA is present.

    Raises
    ------
    UsageError
        When triton was imported before the interpreter could be switched on.
    """
    import os
    import sys

    from miner.core.errors import UsageError

    if os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        if torch.cuda.is_available():
            return
        if "triton" in sys.modules:
            raise UsageError(f"--allow-cpu needs TRITON_INTERPRET=1 set before triton is imported: "
                             f"run `TRITON_INTERPRET=1 miner {verb} --allow-cpu ...`")
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("MINER_INTERPRET", "1")
