"""stallscope's start-up hook: instruments PyTorch with no change to the training script.

``stallscope run`` puts this directory on ``PYTHONPATH``, and Python imports ``sitecustomize``
at start-up in every interpreter of the job (trainers, torchrun, spawned loader workers). This
file must therefore cost next to nothing and never fail:

* it watches for the import of ``torch`` and, once ``torch/__init__`` has run, installs
  ``stallscope._torch_hook``; a program that never imports torch pays one string comparison
  per import;
* it then runs the ``sitecustomize`` that its own would otherwise shadow (Debian ships one), the
  next one on ``sys.path`` after this directory.
"""

import os
import sys


def _install_torch_hook():
    try:
        from stallscope import _torch_hook

        _torch_hook.install()
    except Exception:
        pass


class _TorchImportWatcher:
    """Meta-path finder that lets the other finders find ``torch`` and wraps its execution."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:
            return self._watch(fullname, path, target)
        except Exception:
            return None

    def _watch(self, fullname, path, target):
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return None

        def exec_module(module):
            execute(module)  # torch's own errors propagate unchanged
            try:
                del loader.exec_module
                sys.meta_path.remove(self)
            except Exception:
                pass
            _install_torch_hook()

        loader.exec_module = exec_module  # this loader instance serves torch only
        return spec


def _watch_torch():
    if not os.environ.get("STALLSCOPE_SOCKET") or os.environ.get("STALLSCOPE_AUTO") == "0":
        return
    if "torch" in sys.modules:
        _install_torch_hook()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.realpath(__file__))
    real = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    start = real.index(here) + 1 if here in real else 0
    rest = [entry for entry, path in zip(sys.path[start:], real[start:]) if path != here]
    import importlib.machinery

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = type(sys)(spec.name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    if spec.has_location:
        module.__file__ = spec.origin
    spec.loader.exec_module(module)


for _step in (_watch_torch, _run_next_sitecustomize):
    try:
        _step()
    except Exception:
        pass
del _step
