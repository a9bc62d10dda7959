"""Load `path/to/file.py:factory` or `package.module:factory` and call the factory."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from torch import nn

from trainguard.errors import BadInputError
from trainguard.util.hashing import stable_u64
from trainguard.util.inputs import require_file


class ModelTargetError(BadInputError):
    """The check-model target cannot be loaded or does not build a model."""


_FORMAT = "give TARGET as path/to/file.py:factory or package.module:factory"


def _called_exit(what: str, e: SystemExit) -> ModelTargetError:
    """A user's file or factory that calls exit() (SystemExit is no Exception): bad input,
    exit 2 as the table says, never its own status (SystemExit(7) would exit 7)."""
    return ModelTargetError(
        f"{what} called exit({e.code!r}) instead of returning",
        "the model file must not exit when imported, and the factory must return the model "
        "(remove the sys.exit()/exit() call, or guard it with `if __name__ == '__main__':`)",
    )


def _import_target_module(spec: str, what: str = "model file", fmt: str = _FORMAT) -> Any:
    path = Path(spec)
    if spec.endswith(".py") or path.exists():
        require_file(path, what, fmt, ModelTargetError)
        name = f"_trainguard_target_{stable_u64(str(path.resolve())):x}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ModelTargetError(f"cannot import {spec} as a Python file", fmt)
        module = importlib.util.module_from_spec(module_spec)
        # Let the file import its neighbours, as `python file.py` would.
        sys.path.insert(0, str(path.resolve().parent))
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise ModelTargetError(
                f"importing {spec} raised {type(e).__name__}: {e}", "fix the error in that file"
            ) from e
        except SystemExit as e:
            raise _called_exit(f"importing {spec}", e) from None
        finally:
            sys.path.remove(str(path.resolve().parent))
        return module
    try:
        return importlib.import_module(spec)
    except Exception as e:
        raise ModelTargetError(
            f"cannot import module {spec!r}: {type(e).__name__}: {e}",
            f"{fmt}; the module must be importable (installed or on PYTHONPATH)",
        ) from e
    except SystemExit as e:
        raise _called_exit(f"importing module {spec!r}", e) from None


def load_callable(
    target: str, what: str = "model", fmt: str = _FORMAT, kind: str = "factory"
) -> Any:
    """The callable `target` (`path/to/file.py:function` or `package.module:function`) names,
    not called; ModelTargetError (exit 2) naming the problem otherwise. `what` names it in the
    messages (the model factory, the `--describe` function)."""
    spec, sep, attr = target.rpartition(":")
    if not sep or not spec or not attr:
        raise ModelTargetError(f"{what} target {target!r} names no {kind}", fmt)
    module = _import_target_module(spec, f"{what} file", fmt)
    factory = getattr(module, attr, None)
    if not callable(factory):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ModelTargetError(
            f"{spec} has no callable {attr!r}",
            f"name one of its callables: {', '.join(public[:12]) or '(none)'}",
        )
    return factory


def load_model(target: str) -> nn.Module:
    """The module built by the factory that `target` names."""
    factory = load_callable(target)
    attr = target.rpartition(":")[2]
    try:
        model = factory()
    except Exception as e:
        raise ModelTargetError(
            f"{attr}() raised {type(e).__name__}: {e}",
            "make the factory callable with no arguments",
        ) from e
    except SystemExit as e:
        raise _called_exit(f"the factory {target} ({attr}())", e) from None
    if not isinstance(model, nn.Module):
        raise ModelTargetError(
            f"{attr}() returned {type(model).__name__}, not a torch.nn.Module",
            "return the model (an nn.Module mapping LongTensor [B, T] to logits)",
        )
    return model


def infer_vocab_size(model: nn.Module) -> int | None:
    """num_embeddings of the model's first nn.Embedding (the token embedding by convention)."""
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return int(m.num_embeddings)
    return None
