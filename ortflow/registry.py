"""One registry of names for losses, penalties and optimizers, shared by the trainers and the pipelines.

A class joins its family (``kind``) under the short ``names`` it declares, the first being its canonical name;
a user subclass declaring ``names`` joins it the same way.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, ClassVar


class Parametrized:
    """scikit-learn's parameter protocol (``get_params``, ``set_params``, so ``sklearn.base.clone`` and grid searches
    work; a repr of the settings that differ from the defaults) for the registered parts, without importing
    scikit-learn: it costs seconds, and the pipelines check settings against these classes before any run."""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        if cls.__init__ is object.__init__:
            return []
        parameters = inspect.signature(cls.__init__).parameters.values()
        return sorted(p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                params.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            params[name] = value
        return params

    def set_params(self, **params) -> Parametrized:
        accepted = self._get_param_names()
        for name, value in params.items():
            if name not in accepted:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; its parameters: {accepted}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{name}={getattr(self, name)!r}" for name in self._get_param_names()
                   if not _same(getattr(self, name), defaults.get(name, inspect.Parameter.empty))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def __getstate__(self) -> dict:
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value is default or value == default)
    except (TypeError, ValueError):  # arrays and other values without a plain truth value
        return False


class Registered:
    """Mixin registering every subclass under the ``names`` it declares, in its family ``kind``."""

    kind: ClassVar[str] = ""
    names: ClassVar[tuple] = ()
    _registry: ClassVar[dict[str, dict[Any, type]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        family = Registered._registry.setdefault(cls.kind, {})
        for name in cls.__dict__.get("names", ()):
            family[name] = cls


#: the modules defining ortflow's own members of each family, imported on the first look-up (``import ortflow``
#: loads nothing until a name is used)
FAMILY_MODULES = {"loss": ("ortflow.objectives.losses",), "penalty": ("ortflow.objectives.penalties",),
                  "optimizer": ("ortflow.optimizers.learning_rates",),
                  "trainer": ("ortflow.trainers.full", "ortflow.trainers.fwbw", "ortflow.trainers.torch_trainer")}
#: earlier names of a family (the optimizers' family was called after onnxcustom's classes, learning rates)
KIND_ALIASES = {"learning_rate": "optimizer"}


def register(kind: str, cls: type, *names: str) -> type:
    """Register ``cls`` in the family ``kind`` under ``names`` (default: its class name), for a class that does not
    derive from :class:`Registered` (the trainers, family ``'trainer'``, under the name a training package's
    manifest records)."""
    members = Registered._registry.setdefault(kind, {})
    for name in names or (cls.__name__,):
        members[name] = cls
    return cls


def family(kind: str) -> dict[Any, type]:
    """Name -> class of the family ``kind`` (``'loss'``, ``'penalty'``, ``'optimizer'``, ``'trainer'``)."""
    kind = KIND_ALIASES.get(kind, kind)
    for module in FAMILY_MODULES.get(kind, ()):
        importlib.import_module(module)
    if kind not in Registered._registry:
        raise ValueError(f"kind={kind!r} is not a family; families: {sorted(Registered._registry)}")
    return dict(Registered._registry[kind])


#: onnxcustom's other spellings of registered names (its ``select`` methods), accepted and not listed
ONNXCUSTOM_NAMES = {"optimizer": {"Nesterov": "SGDNesterov"},
                    "loss": {"elastic_error": "elastic", "neglog": "neg_log", "logloss": "log"}}


def lookup(kind: str, name: Any) -> type | None:
    """The class of family ``kind`` registered as ``name``, or named so (its class name, as onnxcustom's code
    passes them: ``'LearningRateSGDNesterov'``, ``'SquareLearningLoss'``), or an onnxcustom spelling of a
    registered name (:data:`ONNXCUSTOM_NAMES`); None for any other name."""
    classes = family(kind)
    if name in classes:
        return classes[name]
    if not isinstance(name, str):
        return None
    name = ONNXCUSTOM_NAMES.get(KIND_ALIASES.get(kind, kind), {}).get(name, name)
    return classes.get(name) or {cls.__name__: cls for cls in classes.values()}.get(name)


def names(kind: str) -> list[str]:
    """The names registered in family ``kind`` (strings only, sorted)."""
    return sorted(n for n in family(kind) if isinstance(n, str))


def select(kind: str, value: Any, argument: str | None = None, **kwargs) -> Any:
    """An instance of family ``kind`` from an instance (returned as is) or a registered name, instantiated with
    the settings ``kwargs``; a setting its class does not take is a ValueError naming the class and the setting
    (the caller passes only the settings that apply). ``argument`` names the parameter in errors (default:
    ``kind``)."""
    kind = KIND_ALIASES.get(kind, kind)
    argument = argument or kind
    classes = family(kind)
    if isinstance(value, Registered) and value.kind == kind:
        if kwargs:
            raise ValueError(f"{argument}={value!r} is an instance: settings {sorted(kwargs)} cannot apply to it")
        return value
    if isinstance(value, str) or value is None:
        cls = lookup(kind, value)
        if cls is None:
            raise ValueError(f"{argument}={value!r} is unknown; choose an instance or one of {names(kind)}")
        taken = settings_of(cls)
        refused = [k for k in kwargs if k not in taken]
        if refused:
            raise ValueError(f"{argument}={value!r} ({cls.__name__}) takes no {', '.join(refused)}; its settings: "
                             f"{taken}")
        return cls(**kwargs)
    raise TypeError(f"{argument}={value!r} must be a registered name or an instance of a {kind} class; "
                    f"names: {names(kind)}")


def settings_of(cls: type) -> list[str]:
    """The settings (constructor parameters) a registered class takes."""
    return list(cls._get_param_names()) if hasattr(cls, "_get_param_names") else []
