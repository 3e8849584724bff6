"""Reading a released package's Python without importing it: just enough of Python to
follow how an engine builds its argparse parser.

`enginetables.extract` hands this module a release's sources (path -> text, straight out
of the archive) and a driver call (`SourceEval.run_function`). The evaluator walks the
syntax trees: module top levels, class bodies, function calls, comprehensions, f-strings,
`typing` annotations, Enums, and the container methods the parsers use. It never executes
the package: no import of torch or of the engine, no environment read (the environment
is empty, the argv is the driver's). Whatever it cannot work out becomes an `Unknown`
carrying the source text it came from, and it goes on; a list that an unknown value
flowed into holds an `Unknown` and is reported as unresolved, never guessed.

`ParserRecorder` stands in for `argparse.ArgumentParser`: its `add_argument` calls are
recorded and turned into flag entries (`flag_entries`) with argparse's own rules for
option strings, dests, actions and nargs.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 40
MAX_STEPS = 2_000_000
MAX_SEQUENCE = 100_000


# -- values the evaluator passes around besides plain Python data -----------------------
@dataclass(frozen=True)
class Unknown:
    """A value the evaluator could not work out; `source` is the expression's text."""

    source: str


@dataclass(frozen=True)
class Ext:
    """An object from outside the release (argparse.BooleanOptionalAction, torch.dtype)."""

    name: str

    @property
    def module(self) -> str:
        return self.name.rpartition(".")[0] or "builtins"


@dataclass(frozen=True)
class Opaque:
    """A callable made by an emulated helper, known by its label (optional_type(int))."""

    label: str


@dataclass(frozen=True)
class TypeForm:
    """A subscripted or combined type: list[int], Literal["a", "b"], int | None.
    `origin` is a builtin type or an Ext (typing.Literal, typing.Union, typing.Annotated);
    `module` is "builtins" for list[int], "typing" for typing.List[int]."""

    origin: Any
    args: tuple[Any, ...]
    module: str = "typing"


LITERAL = Ext("typing.Literal")
UNION = Ext("typing.Union")
ANNOTATED = Ext("typing.Annotated")
NONE_TYPE = type(None)
_TYPING_MODULES = {"typing", "typing_extensions", "types", "collections.abc"}
_TYPING_ALIASES = {"List": list, "Dict": dict, "Set": set, "FrozenSet": frozenset,
                   "Tuple": tuple, "Type": type, "DefaultDict": dict, "OrderedDict": dict}


class _Signal(Exception):
    pass


class _Return(_Signal):
    def __init__(self, value: Any) -> None:
        self.value = value


class _Break(_Signal):
    pass


class _Continue(_Signal):
    pass


class Stop(_Signal):
    """Raised when the driver has what it came for (the parser's parse_args was reached)."""


class BudgetExceeded(RuntimeError):
    pass


@dataclass(eq=False)
class Module:
    name: str
    path: str
    tree: ast.Module
    is_package: bool
    globals: dict[str, Any] = field(default_factory=dict)
    state: str = "new"  # new | running | done


@dataclass(eq=False)
class LazyImport:
    module: str
    attr: str


@dataclass(eq=False)
class ClassVal:
    name: str
    node: ast.ClassDef
    module: Module
    scope: Frame | None
    cache: dict[str, Any] = field(default_factory=dict)
    _bases: list[Any] | None = None
    _mro: list[Any] | None = None

    @property
    def qualname(self) -> str:
        return f"{self.module.name}.{self.name}"

    def __repr__(self) -> str:
        return f"<class {self.qualname}>"


@dataclass(eq=False)
class Instance:
    cls: ClassVal
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class EnumMember:
    cls: ClassVal
    name: str
    value: Any


@dataclass(eq=False)
class FuncVal:
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    module: Module
    closure: Frame | None
    owner: ClassVal | None = None
    kind: str = "function"  # function | staticmethod | classmethod | property
    label: str | None = None

    @property
    def name(self) -> str:
        return "<lambda>" if isinstance(self.node, ast.Lambda) else self.node.name

    @property
    def qualname(self) -> str:
        inner = f"{self.owner.name}.{self.name}" if self.owner else self.name
        return f"{self.module.name}.{inner}"

    def display(self) -> str:
        if self.label:
            return self.label
        if isinstance(self.node, ast.Lambda):
            return ast.unparse(self.node)
        return self.name


@dataclass(eq=False)
class BoundMethod:
    func: FuncVal
    receiver: Any


@dataclass(eq=False)
class SuperVal:
    owner: ClassVal
    receiver: Any


@dataclass(eq=False)
class Builtin:
    name: str
    fn: Callable[[SourceEval, list[Any], dict[str, Any]], Any]


@dataclass(eq=False)
class MethodOf:
    """A method of a plain Python value or of a recorder, not yet called."""

    target: Any
    name: str


@dataclass(eq=False)
class Frame:
    module: Module
    locals: dict[str, Any] = field(default_factory=dict)
    parent: Frame | None = None
    owner: ClassVal | None = None  # the class whose method runs (for super())
    first_arg: Any = None
    class_body: ClassVal | None = None  # evaluating a class body attribute



# -- the argparse stand-in ---------------------------------------------------------------
@dataclass
class Argument:
    """One add_argument call as argparse received it."""

    args: list[Any]
    kwargs: dict[str, Any]
    where: str  # path:line of the call
    condition: str | None = None
    origin: str | None = None  # where derived kwargs came from (a config field)


@dataclass(eq=False)
class ParserRecorder:
    """An argparse parser being built: what was registered on it. `cls` is the release's
    ArgumentParser subclass when it uses one (its __init__ runs with this recorder as
    self); `registry` holds its register() calls ((kind, key) -> value)."""

    prog: str | None = None
    usage: str | None = None
    allow_abbrev: bool = True
    cls: ClassVal | None = None
    arguments: list[Argument] = field(default_factory=list)
    subparsers: list[ParserRecorder] = field(default_factory=list)
    registry: dict[tuple[Any, Any], Any] = field(default_factory=dict)


@dataclass(eq=False)
class GroupRecorder:
    parser: ParserRecorder


@dataclass(eq=False)
class SubparsersRecorder:
    parser: ParserRecorder


def is_unresolved(value: Any) -> bool:
    """True when an Unknown sits in `value` or in a container inside it."""
    if isinstance(value, Unknown):
        return True
    if isinstance(value, dict):
        return any(is_unresolved(k) or is_unresolved(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(is_unresolved(v) for v in value)
    return False


def node_fingerprint(node: ast.AST) -> str:
    """A short hash of a function's syntax (positions left out): emulations of engine
    helpers check it to notice when a release rewrote the helper."""
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


# Method names of plain values the evaluator may call (nothing that reads files or runs code).
_SAFE_METHODS: dict[type, frozenset[str]] = {
    str: frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "replace", "split", "rsplit",
                    "join", "startswith", "endswith", "format", "removeprefix", "removesuffix",
                    "title", "capitalize", "partition", "rpartition", "splitlines", "isdigit",
                    "isidentifier", "casefold", "count", "find", "index", "zfill", "ljust",
                    "rjust", "center", "encode"}),
    list: frozenset({"append", "extend", "insert", "remove", "pop", "index", "count", "copy",
                     "sort", "reverse", "clear"}),
    dict: frozenset({"get", "items", "keys", "values", "pop", "update", "setdefault", "copy",
                     "clear", "popitem"}),
    set: frozenset({"add", "update", "discard", "remove", "pop", "copy", "union",
                    "intersection", "difference", "issubset", "issuperset", "clear",
                    "symmetric_difference"}),
    frozenset: frozenset({"union", "intersection", "difference", "copy", "issubset",
                          "issuperset"}),
    tuple: frozenset({"index", "count"}),
}
_MUTATORS = frozenset({"append", "extend", "insert", "remove", "pop", "update", "setdefault",
                       "add", "discard", "clear", "sort", "reverse", "popitem"})

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.BitOr: operator.or_, ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_PLAIN = (str, int, float, bool, bytes, NONE_TYPE, list, dict, tuple, set, frozenset, type)

Hook = Callable[["SourceEval", list[Any], dict[str, Any]], Any]
BuiltinFn = Callable[["SourceEval", list[Any], dict[str, Any]], Any]


class SourceEval:
    """An evaluator over one release's sources.

    `sources` maps archive paths ("vllm/engine/arg_utils.py") to their text. `hooks` maps a
    function's qualified name ("vllm.engine.arg_utils.get_kwargs") to an emulation that is
    called instead of the function's body. `argv` is what `sys.argv` reads.
    """

    def __init__(self, sources: Mapping[str, str], *, hooks: Mapping[str, Hook] | None = None,
                 argv: Sequence[str] = (), trees: Mapping[str, ast.Module] | None = None) -> None:
        self.sources = sources
        self.trees = trees or {}
        self.hooks = dict(hooks or {})
        self.argv = list(argv)
        self.modules: dict[str, Module] = {}
        self.notes: set[str] = set()
        self.steps = 0
        self.depth = 0
        self.condition: list[str] = []
        self.recorders: list[ParserRecorder] = []
        self._where: str = ""

    # -- modules -------------------------------------------------------------------------
    def module_path(self, name: str) -> tuple[str, bool] | None:
        base = name.replace(".", "/")
        if f"{base}/__init__.py" in self.sources:
            return f"{base}/__init__.py", True
        if f"{base}.py" in self.sources:
            return f"{base}.py", False
        return None

    def has_module(self, name: str) -> bool:
        return name in self.modules or self.module_path(name) is not None

    def module(self, name: str) -> Module | None:
        if name in self.modules:
            return self.modules[name]
        found = self.module_path(name)
        if found is None:
            return None
        path, is_package = found
        tree = self.trees.get(path) or ast.parse(self.sources[path], filename=path)
        mod = Module(name=name, path=path, tree=tree, is_package=is_package)
        mod.globals["__name__"] = name
        self.modules[name] = mod
        return mod

    def run_module(self, mod: Module) -> None:
        if mod.state != "new":
            return
        mod.state = "running"
        frame = Frame(module=mod, locals=mod.globals)
        try:
            self.exec_block(mod.tree.body, frame)
        except _Signal:
            pass
        mod.state = "done"

    def module_global(self, mod: Module, name: str) -> Any:
        self.run_module(mod)
        if name in mod.globals:
            value = mod.globals[name]
            if isinstance(value, LazyImport):
                value = self.resolve_import(value)
                mod.globals[name] = value
            return value
        sub = f"{mod.name}.{name}"
        if mod.is_package and self.has_module(sub):
            return self.module(sub)
        getattr_hook = mod.globals.get("__getattr__")
        if isinstance(getattr_hook, FuncVal):
            return self.call(getattr_hook, [name], {})
        return Unknown(f"{mod.name}.{name}")

    def resolve_import(self, ref: LazyImport) -> Any:
        if self.has_module(ref.module):
            mod = self.module(ref.module)
            assert mod is not None
            if ref.attr == "":
                return mod
            return self.module_global(mod, ref.attr)
        if ref.attr == "":
            return Ext(ref.module)
        return self.ext_value(f"{ref.module}.{ref.attr}")

    def ext_value(self, name: str) -> Any:
        module, _, attr = name.rpartition(".")
        if module in _TYPING_MODULES:
            if attr in _TYPING_ALIASES:
                return _TYPING_ALIASES[attr]
            if attr == "TYPE_CHECKING":
                return False
            if attr in ("Literal", "Union", "Annotated", "Optional", "ClassVar", "Final",
                        "InitVar", "Any", "TypedDict", "NamedTuple", "Callable", "Required",
                        "NotRequired", "Self", "TypeAlias", "get_args", "get_origin",
                        "UnionType", "NoneType", "Sequence", "Mapping", "Iterable"):
                return Ext(f"typing.{attr}")
        special: dict[str, Any] = {
            "argparse.SUPPRESS": "==SUPPRESS==", "sys.argv": self.argv, "sys.modules": {},
            "os.environ": {}, "sys.version_info": (3, 12, 0, "final", 0),
            "sys.platform": "linux", "os.sep": "/", "dataclasses.MISSING": Ext("dataclasses.MISSING"),
        }
        if name in special:
            return special[name]
        return Ext(name)

    # -- running ---------------------------------------------------------------------------
    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise BudgetExceeded(f"more than {MAX_STEPS} evaluation steps")

    def note(self, text: str) -> None:
        self.notes.add(text)

    def where(self, mod: Module, node: ast.AST) -> str:
        return f"{mod.path}:{getattr(node, 'lineno', 0)}"

    def run_function(self, module: str, qualname: str, args: list[Any],
                     kwargs: dict[str, Any] | None = None) -> Any:
        """Call `module.qualname` (a function or Class.method) as the driver."""
        mod = self.module(module)
        if mod is None:
            raise LookupError(f"{module} is not in the release")
        head, _, rest = qualname.partition(".")
        target = self.module_global(mod, head)
        if rest:
            target = self.getattr(target, rest)
        if isinstance(target, Unknown):
            raise LookupError(f"{module}.{qualname} is not in the release")
        try:
            return self.call(target, args, dict(kwargs or {}))
        except Stop:
            return None

    def exec_block(self, stmts: Iterable[ast.stmt], frame: Frame) -> None:
        for stmt in stmts:
            self.exec_stmt(stmt, frame)

    def exec_stmt(self, stmt: ast.stmt, frame: Frame) -> None:
        self.tick()
        mod = frame.module
        if isinstance(stmt, ast.Expr):
            self.eval(stmt.value, frame)
        elif isinstance(stmt, ast.Assign):
            value = self.eval(stmt.value, frame)
            for target in stmt.targets:
                self.assign(target, value, frame)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.assign(stmt.target, self.eval(stmt.value, frame), frame)
        elif isinstance(stmt, ast.AugAssign):
            load = _as_load(stmt.target)
            current = self.eval(load, frame)
            value = self.binop(stmt.op, current, self.eval(stmt.value, frame), stmt, inplace=True)
            self.assign(stmt.target, value, frame)
        elif isinstance(stmt, ast.If):
            self.exec_if(stmt, frame)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self.exec_for(stmt, frame)
        elif isinstance(stmt, ast.While):
            test = self.truth(self.eval(stmt.test, frame))
            if test is False:
                self.exec_block(stmt.orelse, frame)
            else:
                self.note(f"{self.where(mod, stmt)}: while loop skipped")
        elif isinstance(stmt, ast.Try | ast.TryStar):
            self.exec_block(stmt.body, frame)
            self.exec_block(stmt.orelse, frame)
            self.exec_block(stmt.finalbody, frame)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self.exec_with(stmt, frame)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            frame.locals[stmt.name] = self.make_function(stmt, frame, owner=None)
        elif isinstance(stmt, ast.ClassDef):
            cls = ClassVal(name=stmt.name, node=stmt, module=mod,
                           scope=None if frame.locals is mod.globals else frame)
            frame.locals[stmt.name] = cls
        elif isinstance(stmt, ast.Return):
            raise _Return(None if stmt.value is None else self.eval(stmt.value, frame))
        elif isinstance(stmt, ast.Raise):
            raise _Return(Unknown(f"raise at {self.where(mod, stmt)}"))
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            self.exec_import(stmt, frame)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                self.delete(target, frame)
        elif isinstance(stmt, ast.Break):
            raise _Break()
        elif isinstance(stmt, ast.Continue):
            raise _Continue()
        elif type(stmt).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12 syntax)
            name, value = getattr(stmt, "name", None), getattr(stmt, "value", None)
            if isinstance(name, ast.Name) and isinstance(value, ast.expr):
                frame.locals[name.id] = self.eval(value, frame)
        # Pass, Global, Nonlocal, Assert, Match: nothing the parsers depend on.

    def exec_with(self, stmt: ast.With | ast.AsyncWith, frame: Frame) -> None:
        for item in stmt.items:
            self.eval(item.context_expr, frame)
            if item.optional_vars is not None:
                self.assign(item.optional_vars, Unknown(ast.unparse(item.context_expr)), frame)
        self.exec_block(stmt.body, frame)

    def exec_if(self, stmt: ast.If, frame: Frame) -> None:
        test = self.truth(self.eval(stmt.test, frame))
        if isinstance(test, Unknown):
            cond = ast.unparse(stmt.test)
            self.note(f"{self.where(frame.module, stmt)}: condition not known statically, "
                      f"its branch was followed: if {cond}")
            self.condition.append(cond)
            try:
                self.exec_block(stmt.body, frame)
            finally:
                self.condition.pop()
        elif test:
            self.exec_block(stmt.body, frame)
        else:
            self.exec_block(stmt.orelse, frame)

    def exec_for(self, stmt: ast.For | ast.AsyncFor, frame: Frame) -> None:
        iterable = self.eval(stmt.iter, frame)
        items = self.iterate(iterable)
        if items is None:
            self.note(f"{self.where(frame.module, stmt)}: loop over a value not known statically "
                      f"was skipped: for ... in {ast.unparse(stmt.iter)}")
            return
        for item in items:
            self.assign(stmt.target, item, frame)
            try:
                self.exec_block(stmt.body, frame)
            except _Break:
                break
            except _Continue:
                continue
        else:
            self.exec_block(stmt.orelse, frame)

    def exec_import(self, stmt: ast.Import | ast.ImportFrom, frame: Frame) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    frame.locals[alias.asname] = LazyImport(alias.name, "")
                else:
                    top = alias.name.split(".")[0]
                    frame.locals[top] = LazyImport(top, "")
            return
        base = self.absolute_module(frame.module, stmt.module, stmt.level)
        for alias in stmt.names:
            if alias.name == "*":
                self.star_import(base, frame)
                continue
            sub = f"{base}.{alias.name}"
            ref = LazyImport(sub, "") if self.has_module(sub) else LazyImport(base, alias.name)
            frame.locals[alias.asname or alias.name] = ref

    def absolute_module(self, mod: Module, name: str | None, level: int) -> str:
        if level == 0:
            return name or ""
        parts = mod.name.split(".")
        if not mod.is_package:
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([name] if name else []))

    def star_import(self, base: str, frame: Frame) -> None:
        src = self.module(base)
        if src is None:
            return
        self.run_module(src)
        for key, value in src.globals.items():
            if not key.startswith("_"):
                frame.locals[key] = value

    def make_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, frame: Frame | None,
                      owner: ClassVal | None, module: Module | None = None) -> FuncVal:
        kind = "function"
        for deco in node.decorator_list:
            text = ast.unparse(deco)
            if text.endswith("staticmethod"):
                kind = "staticmethod"
            elif text.endswith("classmethod"):
                kind = "classmethod"
            elif text.endswith("property") or text.endswith("cached_property"):
                kind = "property"
        module = module or (frame.module if frame is not None else None)
        assert module is not None
        return FuncVal(node=node, module=module, closure=frame, owner=owner, kind=kind)

    # -- assignment ----------------------------------------------------------------------
    def assign(self, target: ast.expr, value: Any, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            previous = frame.locals.get(target.id)
            if isinstance(previous, ClassVal) and isinstance(value, Unknown):
                # `X = make_struct(X, ...)`: a class rebuilt by code outside the release
                # keeps the body it was written with.
                self.note(f"{self.where(frame.module, target)}: {target.id} is rebuilt by "
                          f"{value.source[:80]}; its class statement is read instead")
                return
            frame.locals[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items = self.iterate(value)
            starred = [i for i, t in enumerate(target.elts) if isinstance(t, ast.Starred)]
            if items is None or (not starred and len(items) != len(target.elts)):
                for elt in target.elts:
                    inner = elt.value if isinstance(elt, ast.Starred) else elt
                    self.assign(inner, Unknown(ast.unparse(target)), frame)
                return
            if starred:
                i = starred[0]
                tail = len(target.elts) - i - 1
                head_items, rest = items[:i], items[i:]
                mid, end = (rest[: len(rest) - tail], rest[len(rest) - tail:]) if tail else (rest, [])
                for elt, item in zip(target.elts[:i], head_items, strict=False):
                    self.assign(elt, item, frame)
                star = target.elts[i]
                assert isinstance(star, ast.Starred)
                self.assign(star.value, list(mid), frame)
                for elt, item in zip(target.elts[i + 1:], end, strict=False):
                    self.assign(elt, item, frame)
                return
            for elt, item in zip(target.elts, items, strict=True):
                self.assign(elt, item, frame)
        elif isinstance(target, ast.Subscript):
            container = self.eval(target.value, frame)
            key = self.eval(target.slice, frame)
            if isinstance(container, dict | list):
                if isinstance(key, Unknown):
                    self.taint(container, target)
                    return
                try:
                    container[key] = value
                except (TypeError, IndexError):
                    self.taint(container, target)
        elif isinstance(target, ast.Attribute):
            obj = self.eval(target.value, frame)
            if isinstance(obj, Instance):
                obj.attrs[target.attr] = value
            elif isinstance(obj, ClassVal):
                obj.cache[target.attr] = value
            elif isinstance(obj, ParserRecorder) and target.attr == "usage":
                obj.usage = value if isinstance(value, str) else None
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value, frame)

    def delete(self, target: ast.expr, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.locals.pop(target.id, None)
        elif isinstance(target, ast.Subscript):
            container = self.eval(target.value, frame)
            key = self.eval(target.slice, frame)
            if isinstance(container, dict | list) and not isinstance(key, Unknown):
                try:
                    del container[key]
                except (KeyError, IndexError, TypeError):
                    self.note(f"{self.where(frame.module, target)}: del of a missing item: "
                              f"{ast.unparse(target)}")

    def taint(self, container: Any, node: ast.AST | str) -> None:
        """Mark a container an unknown value was written into."""
        marker = Unknown(ast.unparse(node) if isinstance(node, ast.AST) else str(node))
        if isinstance(container, list):
            container.append(marker)
        elif isinstance(container, set):
            container.add(marker)
        elif isinstance(container, dict):
            container[marker] = marker

    # -- expressions -----------------------------------------------------------------------
    def eval(self, node: ast.expr, frame: Frame) -> Any:
        self.tick()
        try:
            return self._eval(node, frame)
        except (_Signal, BudgetExceeded):
            raise
        except RecursionError:
            raise
        except Exception:
            return Unknown(ast.unparse(node))

    def _eval(self, node: ast.expr, frame: Frame) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id, frame)
        if isinstance(node, ast.Attribute):
            return self.getattr(self.eval(node.value, frame), node.attr)
        if isinstance(node, ast.Subscript):
            return self.subscript(self.eval(node.value, frame), node.slice, frame, node)
        if isinstance(node, ast.Call):
            return self.eval_call(node, frame)
        if isinstance(node, ast.JoinedStr):
            return self.joined_str(node, frame)
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return self.eval_sequence(node, frame)
        if isinstance(node, ast.Dict):
            return self.eval_dict(node, frame)
        if isinstance(node, ast.UnaryOp):
            return self.eval_unary(node, frame)
        if isinstance(node, ast.BoolOp):
            return self.eval_boolop(node, frame)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            return self.eval_comprehension(node, frame)
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.eval(node.left, frame), self.eval(node.right, frame), node)
        if isinstance(node, ast.Compare):
            return self.compare(node, frame)
        if isinstance(node, ast.IfExp):
            truth = self.truth(self.eval(node.test, frame))
            if isinstance(truth, Unknown):
                return Unknown(ast.unparse(node))
            return self.eval(node.body if truth else node.orelse, frame)
        if isinstance(node, ast.Lambda):
            return FuncVal(node=node, module=frame.module, closure=frame)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value, frame)
            self.assign(node.target, value, frame)
            return value
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.eval(p, frame)
                     for p in (node.lower, node.upper, node.step)]
            if any(isinstance(p, Unknown) for p in parts):
                return Unknown(ast.unparse(node))
            return slice(*parts)
        if isinstance(node, ast.Starred):
            return self.eval(node.value, frame)
        return Unknown(ast.unparse(node))

    def eval_sequence(self, node: ast.List | ast.Tuple | ast.Set, frame: Frame) -> Any:
        items: list[Any] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                inner = self.iterate(self.eval(elt.value, frame))
                if inner is None:
                    items.append(Unknown(ast.unparse(elt)))
                else:
                    items.extend(inner)
            else:
                items.append(self.eval(elt, frame))
        if isinstance(node, ast.List):
            return items
        if isinstance(node, ast.Tuple):
            return tuple(items)
        return _safe_set(items)

    def eval_dict(self, node: ast.Dict, frame: Frame) -> Any:
        out: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                inner = self.eval(value_node, frame)
                if isinstance(inner, dict):
                    out.update(inner)
                else:
                    marker = Unknown(ast.unparse(value_node))
                    out[marker] = marker
                continue
            key = self.eval(key_node, frame)
            try:
                out[key] = self.eval(value_node, frame)
            except TypeError:
                marker = Unknown(ast.unparse(key_node))
                out[marker] = marker
        return out

    def eval_unary(self, node: ast.UnaryOp, frame: Frame) -> Any:
        operand = self.eval(node.operand, frame)
        if isinstance(node.op, ast.Not):
            truth = self.truth(operand)
            return truth if isinstance(truth, Unknown) else not truth
        if not _is_plain(operand):
            return Unknown(ast.unparse(node))
        unary: dict[type, Callable[[Any], Any]] = {
            ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
        return unary[type(node.op)](operand)

    def eval_boolop(self, node: ast.BoolOp, frame: Frame) -> Any:
        is_and = isinstance(node.op, ast.And)
        result: Any = None
        for value_node in node.values:
            result = self.eval(value_node, frame)
            truth = self.truth(result)
            if isinstance(truth, Unknown):
                return Unknown(ast.unparse(node))
            if truth is not is_and:
                return result
        return result

    def eval_comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, frame: Frame
    ) -> Any:
        if isinstance(node, ast.DictComp):
            pairs = self.comprehension(node.generators, [node.key, node.value], frame, node)
            if isinstance(pairs, Unknown):
                return pairs
            return {k: v for k, v in pairs}
        values = self.comprehension(node.generators, [node.elt], frame, node)
        if isinstance(values, Unknown):
            return values
        flat = [v[0] for v in values]
        return _safe_set(flat) if isinstance(node, ast.SetComp) else flat

    def lookup(self, name: str, frame: Frame) -> Any:
        found, value = False, None
        scope: Frame | None = frame
        while scope is not None and not found:
            if name in scope.locals:
                found, value = True, scope.locals[name]
            elif scope.class_body is not None:
                found, value = self.class_attr_local(scope.class_body, name)
            scope = scope.parent
        if not found:
            mod = frame.module
            if name in mod.globals or mod.state == "new":
                value = self.module_global(mod, name)
                found = not isinstance(value, Unknown)
            if not found:
                builtin = self.builtin(name)
                if builtin is not None:
                    return builtin
                return Unknown(name)
        if isinstance(value, LazyImport):
            value = self.resolve_import(value)
        return value

    def class_attr_local(self, cls: ClassVal, name: str) -> tuple[bool, Any]:
        for stmt in cls.node.body:
            if _binds(stmt, name):
                return True, self.class_attr(cls, name)
        return False, None

    def joined_str(self, node: ast.JoinedStr, frame: Frame) -> Any:
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
                continue
            assert isinstance(value, ast.FormattedValue)
            inner = self.eval(value.value, frame)
            if not _is_plain(inner) or is_unresolved(inner):
                if isinstance(inner, EnumMember):
                    inner = inner.value if _is_str_enum(inner.cls, self) else f"{inner.cls.name}.{inner.name}"
                else:
                    return Unknown(ast.unparse(node))
            spec = ""
            if isinstance(value.format_spec, ast.JoinedStr):
                spec_value = self.joined_str(value.format_spec, frame)
                if isinstance(spec_value, Unknown):
                    return Unknown(ast.unparse(node))
                spec = spec_value
            if value.conversion == ord("r"):
                inner = repr(inner)
            elif value.conversion == ord("s"):
                inner = str(inner)
            parts.append(format(inner, spec))
        return "".join(parts)

    def binop(self, op: ast.operator, left: Any, right: Any, node: ast.AST, *,
              inplace: bool = False) -> Any:
        if isinstance(op, ast.BitOr) and (_is_type_like(left) or _is_type_like(right)) \
                and not (isinstance(left, dict | set) and isinstance(right, dict | set)):
            return union_of([left, right])
        if isinstance(left, Unknown) or isinstance(right, Unknown):
            return Unknown(ast.unparse(node))
        if not (_is_plain(left) and _is_plain(right)):
            return Unknown(ast.unparse(node))
        if isinstance(op, ast.Mult) and isinstance(left, str | list | tuple) \
                and isinstance(right, int) and len(left) * right > MAX_SEQUENCE:
            return Unknown(ast.unparse(node))
        if isinstance(op, ast.Pow) and isinstance(right, int) and right > 4096:
            return Unknown(ast.unparse(node))
        if inplace and isinstance(left, list) and isinstance(op, ast.Add):
            left.extend(right)
            return left
        if inplace and isinstance(left, dict | set) and isinstance(op, ast.BitOr):
            left.update(right)
            return left
        return _BINOPS[type(op)](left, right)

    def compare(self, node: ast.Compare, frame: Frame) -> Any:
        left = self.eval(node.left, frame)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comparator, frame)
            if isinstance(op, ast.Is | ast.IsNot):
                if isinstance(left, Unknown) or isinstance(right, Unknown):
                    return Unknown(ast.unparse(node))
                result = (left is right) if not (isinstance(left, Ext) and isinstance(right, Ext)) \
                    else left == right
                if isinstance(op, ast.IsNot):
                    result = not result
            else:
                if isinstance(left, Unknown) or isinstance(right, Unknown):
                    return Unknown(ast.unparse(node))
                uncertain = (any(isinstance(k, Unknown) for k in right) if isinstance(right, dict)
                             else is_unresolved(right))
                if isinstance(op, ast.In | ast.NotIn) and uncertain:
                    if left in right:
                        result = isinstance(op, ast.In)
                    else:
                        return Unknown(ast.unparse(node))
                elif isinstance(op, ast.In | ast.NotIn) and isinstance(right, dict):
                    result = _CMPOPS[type(op)](left, right)
                else:
                    if not (_is_plain(left) or _is_marker(left)) or not (
                            _is_plain(right) or _is_marker(right)):
                        return Unknown(ast.unparse(node))
                    result = _CMPOPS[type(op)](left, right)
            if not result:
                return False
            left = right
        return True

    def truth(self, value: Any) -> Any:
        if isinstance(value, Unknown):
            return value
        if isinstance(value, _PLAIN):
            return bool(value)
        if isinstance(value, EnumMember):
            return bool(value.value) if isinstance(value.value, int | str) else True
        return True

    def comprehension(self, generators: list[ast.comprehension], elts: list[ast.expr],
                      frame: Frame, node: ast.expr) -> list[list[Any]] | Unknown:
        inner = Frame(module=frame.module, parent=frame, owner=frame.owner,
                      first_arg=frame.first_arg)
        out: list[list[Any]] = []

        def walk(level: int) -> bool:
            if level == len(generators):
                out.append([self.eval(e, inner) for e in elts])
                return True
            gen = generators[level]
            items = self.iterate(self.eval(gen.iter, inner))
            if items is None:
                return False
            for item in items:
                self.assign(gen.target, item, inner)
                keep: Any = True
                for cond in gen.ifs:
                    keep = self.truth(self.eval(cond, inner))
                    if isinstance(keep, Unknown) or not keep:
                        break
                if isinstance(keep, Unknown):
                    return False
                if keep and not walk(level + 1):
                    return False
            return True

        if not walk(0):
            return Unknown(ast.unparse(node))
        return out

    def iterate(self, value: Any) -> list[Any] | None:
        if isinstance(value, str | list | tuple):
            return list(value)
        if isinstance(value, dict):
            return list(value.keys())
        if isinstance(value, set | frozenset):
            return sorted(value, key=_sort_key)
        if isinstance(value, range) and len(value) <= MAX_SEQUENCE:
            return list(value)
        if isinstance(value, ClassVal) and self.is_enum(value):
            return self.enum_members(value)
        if isinstance(value, TypeForm) and value.origin == LITERAL:
            return None
        return None

    def subscript(self, container: Any, slice_node: ast.expr, frame: Frame, node: ast.expr) -> Any:
        # Types: Literal["a", "b"], list[int], Optional[X], Annotated[T, meta].
        if _is_type_constructor(container):
            if isinstance(slice_node, ast.Tuple):
                args = tuple(self.eval(e, frame) for e in slice_node.elts)
            else:
                args = (self.eval(slice_node, frame),)
            return make_type(container, args)
        key = self.eval(slice_node, frame)
        if isinstance(container, Unknown) or isinstance(key, Unknown):
            return Unknown(ast.unparse(node))
        if isinstance(container, TypeForm):
            return Unknown(ast.unparse(node))
        if isinstance(container, dict | list | tuple | str):
            return container[key]
        if isinstance(container, ClassVal) and self.is_enum(container) and isinstance(key, str):
            for member in self.enum_members(container):
                if member.name == key:
                    return member
        return Unknown(ast.unparse(node))

    # -- attributes ------------------------------------------------------------------------
    def getattr(self, obj: Any, name: str) -> Any:
        if "." in name:
            for part in name.split("."):
                obj = self.getattr(obj, part)
            return obj
        if isinstance(obj, Unknown):
            return Unknown(f"{obj.source}.{name}")
        if isinstance(obj, LazyImport):
            obj = self.resolve_import(obj)
        if isinstance(obj, Module):
            return self.module_global(obj, name)
        if isinstance(obj, Ext):
            return self.ext_value(f"{obj.name}.{name}")
        if isinstance(obj, ClassVal | Instance | SuperVal | EnumMember):
            return self.object_attr(obj, name)
        if isinstance(obj, FuncVal | BoundMethod | TypeForm):
            return self.callable_attr(obj, name)
        if isinstance(obj, ParserRecorder | GroupRecorder | SubparsersRecorder):
            return MethodOf(obj, name)
        if isinstance(obj, type) and obj in (int, str, float, bool, list, dict, tuple, set):
            if name == "__name__":
                return obj.__name__
            if name == "__module__":
                return "builtins"
            return Unknown(f"{obj.__name__}.{name}")
        for kind, names in _SAFE_METHODS.items():
            if type(obj) is kind and name in names:
                return MethodOf(obj, name)
        return Unknown(f"{type(obj).__name__}.{name}")

    def object_attr(self, obj: ClassVal | Instance | SuperVal | EnumMember, name: str) -> Any:
        """An attribute of a class, an instance, `super()` or an enum member."""
        if isinstance(obj, ClassVal):
            if name == "__name__" or name == "__qualname__":
                return obj.name
            if name == "__module__":
                return obj.module.name
            if name == "__doc__":
                return ast.get_docstring(obj.node)
            return self.bind(self.class_lookup(obj, name), obj, obj)
        if isinstance(obj, Instance):
            if name in obj.attrs:
                return obj.attrs[name]
            if name == "__class__":
                return obj.cls
            return self.bind(self.class_lookup(obj.cls, name), obj, obj.cls)
        if isinstance(obj, SuperVal):
            cls = obj.receiver if isinstance(obj.receiver, ClassVal) else getattr(obj.receiver, "cls", None)
            if not isinstance(cls, ClassVal):
                return Unknown(f"super().{name}")
            mro = self.mro(cls)
            after = mro[mro.index(obj.owner) + 1:] if obj.owner in mro else mro
            for base in after:
                if isinstance(base, ClassVal):
                    found, value = self.class_attr_local(base, name)
                    if found:
                        return self.bind(value, obj.receiver, cls)
            return Unknown(f"super().{name}")
        if name == "value":
            return obj.value
        if name == "name":
            return obj.name
        return self.bind(self.class_lookup(obj.cls, name), obj, obj.cls)

    def callable_attr(self, obj: FuncVal | BoundMethod | TypeForm, name: str) -> Any:
        """An attribute of a function, a bound method or a typing form."""
        if isinstance(obj, TypeForm):
            if name == "__args__":
                return obj.args
            if name == "__origin__":
                return obj.origin
            return Unknown(f"type.{name}")
        func = obj.func if isinstance(obj, BoundMethod) else obj
        if name == "__name__":
            return func.name
        if name == "__doc__":
            return None if isinstance(func.node, ast.Lambda) else ast.get_docstring(func.node)
        return Unknown(f"{func.name}.{name}")

    def bind(self, value: Any, receiver: Any, cls: ClassVal) -> Any:
        if isinstance(value, FuncVal):
            if value.kind == "classmethod":
                return BoundMethod(value, cls)
            if value.kind == "staticmethod":
                return value
            if value.kind == "property":
                if isinstance(receiver, Instance):
                    return self.call(BoundMethod(value, receiver), [], {})
                return Unknown(f"{cls.name}.{value.name}")
            if isinstance(receiver, Instance | EnumMember):
                return BoundMethod(value, receiver)
        return value

    def class_attr(self, cls: ClassVal, name: str) -> Any:
        if name in cls.cache:
            return cls.cache[name]
        value: Any = Unknown(f"{cls.name}.{name}")
        scope = Frame(module=cls.module, parent=cls.scope, class_body=cls)
        enum_class = self.is_enum(cls)
        for stmt in cls.node.body:
            if not _binds(stmt, name):
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                # A method does not see the class body's names, only the enclosing scope.
                value = self.make_function(stmt, cls.scope, owner=cls, module=cls.module)
            elif isinstance(stmt, ast.ClassDef):
                value = ClassVal(name=stmt.name, node=stmt, module=cls.module, scope=scope)
            elif isinstance(stmt, ast.Assign) and not enum_class:
                cls.cache[name] = Unknown(f"{cls.name}.{name}")  # guards self-reference
                value = self.eval(stmt.value, scope)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and not enum_class:
                cls.cache[name] = Unknown(f"{cls.name}.{name}")
                value = self.eval(stmt.value, scope)
            elif enum_class and isinstance(stmt, ast.Assign | ast.AnnAssign):
                for member in self.enum_members(cls):
                    if member.name == name:
                        value = member
        cls.cache[name] = value
        return value

    def class_lookup(self, cls: ClassVal, name: str) -> Any:
        for base in self.mro(cls):
            if isinstance(base, ClassVal):
                found, value = self.class_attr_local(base, name)
                if found:
                    return value
        return Unknown(f"{cls.name}.{name}")

    def bases(self, cls: ClassVal) -> list[Any]:
        if cls._bases is None:
            cls._bases = []
            frame = Frame(module=cls.module, locals=cls.module.globals, parent=cls.scope)
            if cls.scope is not None:
                frame = Frame(module=cls.module, parent=cls.scope)
            for base in cls.node.bases:
                value = self.eval(base, frame)
                if isinstance(value, TypeForm):  # Generic[T], list[str]
                    value = value.origin
                cls._bases.append(value)
        return cls._bases

    def mro(self, cls: ClassVal) -> list[Any]:
        if cls._mro is not None:
            return cls._mro
        cls._mro = [cls]  # guards cycles
        seqs = [self.mro(b) if isinstance(b, ClassVal) else [b] for b in self.bases(cls)]
        seqs.append(list(self.bases(cls)))
        result: list[Any] = [cls]
        seqs = [list(s) for s in seqs if s]
        while seqs:
            for seq in seqs:
                head = seq[0]
                if not any(head in s[1:] for s in seqs):
                    break
            else:
                head = seqs[0][0]  # inconsistent hierarchy: take the first
            result.append(head)
            seqs = [[x for x in s if x is not head and x != head] for s in seqs]
            seqs = [s for s in seqs if s]
        cls._mro = result
        return result

    def inherits(self, cls: ClassVal, names: Iterable[str]) -> bool:
        wanted = set(names)
        for base in self.mro(cls):
            if isinstance(base, Ext) and (base.name in wanted or base.name.rpartition(".")[2] in wanted):
                return True
            if isinstance(base, ClassVal) and base.name in wanted:
                return True
            if isinstance(base, type) and base.__name__ in wanted:
                return True
        return False

    def is_enum(self, cls: ClassVal) -> bool:
        return self.inherits(cls, ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"))

    def enum_members(self, cls: ClassVal) -> list[EnumMember]:
        key = "__members__"
        if key in cls.cache:
            return list(cls.cache[key])
        members: list[EnumMember] = []
        cls.cache[key] = members
        scope = Frame(module=cls.module, parent=cls.scope)
        auto_value = 0
        for stmt in cls.node.body:
            targets: list[ast.expr] = []
            value_node: ast.expr | None = None
            if isinstance(stmt, ast.Assign):
                targets, value_node = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value_node = [stmt.target], stmt.value
            for target in targets:
                if not isinstance(target, ast.Name) or target.id.startswith("_"):
                    continue
                assert value_node is not None
                if isinstance(value_node, ast.Call) and ast.unparse(value_node.func).endswith("auto"):
                    auto_value += 1
                    value: Any = target.id.lower() if self.inherits(cls, ("StrEnum",)) else auto_value
                else:
                    value = self.eval(value_node, scope)
                members.append(EnumMember(cls, target.id, value))
        return list(members)

    # -- calls -----------------------------------------------------------------------------
    def eval_call(self, node: ast.Call, frame: Frame) -> Any:
        func = self.eval(node.func, frame)
        args: list[Any] = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                items = self.iterate(self.eval(arg.value, frame))
                if items is None:
                    args.append(Unknown(ast.unparse(arg)))
                else:
                    args.extend(items)
            else:
                args.append(self.eval(arg, frame))
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            value = self.eval(kw.value, frame)
            if kw.arg is None:
                if isinstance(value, dict):
                    kwargs.update({str(k) if not isinstance(k, Unknown) else f"**{k.source}": v
                                   for k, v in value.items()})
                else:
                    kwargs[f"**{ast.unparse(kw.value)}"] = Unknown(ast.unparse(kw.value))
            else:
                kwargs[kw.arg] = value
        if isinstance(func, Builtin) and func.name == "super" and not args:
            if frame.owner is None:
                return Unknown("super()")
            return SuperVal(frame.owner, frame.first_arg)
        previous = self._where
        self._where = self.where(frame.module, node)
        try:
            result = self.call(func, args, kwargs, node=node)
        finally:
            self._where = previous
        return result

    def call(self, func: Any, args: list[Any], kwargs: dict[str, Any], *,
             node: ast.Call | None = None) -> Any:
        source = ast.unparse(node) if node is not None else "call"
        if isinstance(func, LazyImport):
            func = self.resolve_import(func)
        if isinstance(func, Builtin):
            return func.fn(self, args, kwargs)
        if isinstance(func, MethodOf):
            return self.call_method(func, args, kwargs, source)
        if isinstance(func, BoundMethod):
            return self.call_function(func.func, [func.receiver, *args], kwargs, source)
        if isinstance(func, FuncVal):
            return self.call_function(func, args, kwargs, source)
        if isinstance(func, ClassVal):
            return self.instantiate(func, args, kwargs, source)
        if isinstance(func, Ext):
            return self.call_ext(func, args, kwargs, source)
        if isinstance(func, type) and func in _CONSTRUCTORS:
            return _CONSTRUCTORS[func](self, args, kwargs)
        if any(isinstance(a, ParserRecorder | GroupRecorder) for a in [*args, *kwargs.values()]):
            self.note(f"{self._where}: the parser is passed to a call not known statically: "
                      f"{source}")
        return Unknown(source)

    def call_function(self, func: FuncVal, args: list[Any], kwargs: dict[str, Any],
                      source: str) -> Any:
        hook = self.hooks.get(func.qualname)
        if hook is not None:
            return hook(self, args, kwargs)
        if self.depth >= MAX_DEPTH:
            self.note(f"{self._where}: calls nested too deep, not followed: {func.qualname}")
            return Unknown(source)
        frame = Frame(module=func.module, parent=func.closure, owner=func.owner,
                      first_arg=args[0] if args else None)
        self.bind_params(func, args, kwargs, frame)
        self.depth += 1
        try:
            if isinstance(func.node, ast.Lambda):
                result = self.eval(func.node.body, frame)
            else:
                self.exec_block(func.node.body, frame)
                result = None
        except _Return as ret:
            result = ret.value
        except (_Break, _Continue):
            result = None
        finally:
            self.depth -= 1
        if isinstance(result, FuncVal) and result.closure is frame and result.label is None:
            shown_args = ", ".join(display_callable(a) for a in args)
            result.label = f"{func.name}({shown_args})"
        return result

    def bind_params(self, func: FuncVal, args: list[Any], kwargs: dict[str, Any],
                    frame: Frame) -> None:
        spec = func.node.args
        positional = [*spec.posonlyargs, *spec.args]
        defaults = list(spec.defaults)
        default_frame = func.closure or Frame(module=func.module, locals=func.module.globals)
        first_default = len(positional) - len(defaults)
        remaining = dict(kwargs)
        for i, param in enumerate(positional):
            if i < len(args):
                frame.locals[param.arg] = args[i]
            elif param.arg in remaining:
                frame.locals[param.arg] = remaining.pop(param.arg)
            elif i >= first_default:
                frame.locals[param.arg] = self.eval(defaults[i - first_default], default_frame)
            else:
                frame.locals[param.arg] = Unknown(param.arg)
        if spec.vararg is not None:
            frame.locals[spec.vararg.arg] = tuple(args[len(positional):])
        for param, default in zip(spec.kwonlyargs, spec.kw_defaults, strict=True):
            if param.arg in remaining:
                frame.locals[param.arg] = remaining.pop(param.arg)
            elif default is not None:
                frame.locals[param.arg] = self.eval(default, default_frame)
            else:
                frame.locals[param.arg] = Unknown(param.arg)
        if spec.kwarg is not None:
            frame.locals[spec.kwarg.arg] = remaining

    def instantiate(self, cls: ClassVal, args: list[Any], kwargs: dict[str, Any], source: str) -> Any:
        hook = self.hooks.get(cls.qualname)
        if hook is not None:
            return hook(self, args, kwargs)
        if self.inherits(cls, ("argparse.ArgumentParser", "ArgumentParser")):
            return self.new_recorder(kwargs, cls=cls, args=args)
        if self.is_enum(cls):
            for member in self.enum_members(cls):
                if args and member.value == args[0]:
                    return member
            return Unknown(source)
        instance = Instance(cls)
        init = self.class_lookup(cls, "__init__")
        if isinstance(init, FuncVal):
            self.call_function(init, [instance, *args], kwargs, source)
            return instance
        # A dataclass / msgspec.Struct / NamedTuple: fields in declaration order.
        names = [n for n, _ in self.annotated_fields(cls)]
        for name, value in zip(names, args, strict=False):
            instance.attrs[name] = value
        for name, value in kwargs.items():
            instance.attrs[name] = value
        return instance

    def new_recorder(self, kwargs: Mapping[str, Any], *, cls: ClassVal | None = None,
                     args: Sequence[Any] = ()) -> ParserRecorder:
        prog = kwargs.get("prog", args[0] if args else None)
        usage = kwargs.get("usage")
        recorder = ParserRecorder(prog=prog if isinstance(prog, str) else None,
                                  usage=usage if isinstance(usage, str) else None,
                                  allow_abbrev=kwargs.get("allow_abbrev", True) is not False,
                                  cls=cls)
        self.recorders.append(recorder)
        if cls is not None:
            init = self.class_lookup(cls, "__init__")
            if isinstance(init, FuncVal):
                # argparse's own __init__ is outside the release; the subclass's runs.
                self.call_function(init, [recorder, *args], dict(kwargs), f"{cls.name}()")
        return recorder

    def call_ext(self, func: Ext, args: list[Any], kwargs: dict[str, Any], source: str) -> Any:
        name = func.name
        short = name.rpartition(".")[2]
        if name in ("argparse.ArgumentParser",):
            return self.new_recorder(kwargs)
        if name in ("typing.get_args",):
            return args[0].args if args and isinstance(args[0], TypeForm) else ()
        if name in ("typing.get_origin",):
            return args[0].origin if args and isinstance(args[0], TypeForm) else None
        if name in ("typing.cast",) and len(args) == 2:
            return args[1]
        if name in ("itertools.permutations", "itertools.combinations", "itertools.product",
                    "itertools.chain"):
            iterables = [self.iterate(a) for a in args]
            if any(i is None for i in iterables) or not all(_is_plain(v) for v in kwargs.values()):
                return Unknown(source)
            made = list(itertools.islice(getattr(itertools, short)(*iterables, **kwargs),
                                         MAX_SEQUENCE + 1))
            return Unknown(source) if len(made) > MAX_SEQUENCE else made
        if name in ("os.getenv", "os.environ.get"):
            return args[1] if len(args) > 1 else kwargs.get("default")
        if short in ("field", "Field") and name.split(".")[0] in ("dataclasses", "msgspec", "pydantic"):
            return Opaque(f"{name}(...)")  # a field specifier: only ever a default
        if any(isinstance(a, ParserRecorder | GroupRecorder) for a in [*args, *kwargs.values()]):
            self.note(f"{self._where}: the parser is passed to a call outside the release: {source}")
        return Unknown(source)

    def call_method(self, method: MethodOf, args: list[Any], kwargs: dict[str, Any],
                    source: str) -> Any:
        target, name = method.target, method.name
        if isinstance(target, ParserRecorder | GroupRecorder | SubparsersRecorder):
            return self.recorder_method(target, name, args, kwargs, source)
        if name in _MUTATORS and (is_unresolved(args) or is_unresolved(kwargs)):
            self.taint(target, source)
            return Unknown(source)
        if any(not (_is_plain(a) or _is_marker(a)) for a in [*args, *kwargs.values()]):
            return Unknown(source)
        if name == "sort" and isinstance(target, list) and not kwargs:
            target.sort(key=_sort_key)
            return None
        bound = getattr(target, name)
        try:
            result = bound(*args, **kwargs)
            if name in ("keys", "values", "items") and isinstance(target, dict):
                return list(result)
            return result
        except (KeyError, ValueError, IndexError) as exc:
            if name in ("remove", "pop", "index"):
                self.note(f"{self._where}: {source} failed on the static value: {exc!r}")
            return Unknown(source)

    def recorder_method(self, target: Any, name: str, args: list[Any], kwargs: dict[str, Any],
                        source: str) -> Any:
        parser = target if isinstance(target, ParserRecorder) else target.parser
        if isinstance(target, SubparsersRecorder):
            if name == "add_parser":
                prog_name = args[0] if args and isinstance(args[0], str) else "?"
                sub_kwargs = {k: v for k, v in kwargs.items() if k not in ("help", "aliases")}
                sub_kwargs.setdefault("prog", f"{parser.prog or ''} {prog_name}".strip())
                sub = self.new_recorder(sub_kwargs, cls=parser.cls)
                parser.subparsers.append(sub)
                return sub
            return Unknown(source)
        if name == "add_argument":
            condition = " and ".join(self.condition) if self.condition else None
            kwargs = dict(kwargs)
            origin = kwargs.pop("__origin__", None)
            parser.arguments.append(Argument(list(args), kwargs, self._where, condition,
                                             origin if isinstance(origin, str) else None))
            return Unknown(source)
        if name in ("add_argument_group", "add_mutually_exclusive_group"):
            return GroupRecorder(parser)
        if name == "add_subparsers":
            return SubparsersRecorder(parser)
        if name in ("parse_args", "parse_known_args"):
            raise Stop()
        if name == "register" and len(args) == 3:
            try:
                parser.registry[(args[0], args[1])] = args[2]
            except TypeError:
                self.note(f"{self._where}: parser.register with a key not known statically")
            return None
        return Unknown(source)

    # -- dataclass-like fields -------------------------------------------------------------
    def annotated_fields(self, cls: ClassVal) -> list[tuple[str, ast.AnnAssign]]:
        """Fields in declaration order, bases first (what dataclasses.fields returns)."""
        seen: dict[str, tuple[ClassVal, ast.AnnAssign]] = {}
        for base in reversed(self.mro(cls)):
            if not isinstance(base, ClassVal):
                continue
            for stmt in base.node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    text = ast.unparse(stmt.annotation)
                    if "ClassVar" in text or "InitVar" in text:
                        continue
                    seen.pop(stmt.target.id, None)
                    seen[stmt.target.id] = (base, stmt)
        return [(name, stmt) for name, (_, stmt) in seen.items()]

    def field_owner(self, cls: ClassVal, name: str) -> ClassVal:
        owner = cls
        for base in reversed(self.mro(cls)):
            if isinstance(base, ClassVal) and any(
                    isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and s.target.id == name for s in base.node.body):
                owner = base
        return owner

    def annotation(self, cls: ClassVal, node: ast.expr) -> Any:
        """A field annotation's value, evaluated where the class was written; string
        annotations (PEP 563) are parsed first."""
        frame = Frame(module=cls.module, parent=cls.scope, class_body=cls)
        return self.eval_annotation(node, frame)

    def eval_annotation(self, node: ast.expr, frame: Frame) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                parsed = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return Unknown(node.value)
            return self.eval_annotation(parsed, frame)
        if isinstance(node, ast.Constant) and node.value is None:
            return NONE_TYPE
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return union_of([self.eval_annotation(node.left, frame),
                             self.eval_annotation(node.right, frame)])
        if isinstance(node, ast.Subscript):
            container = self.eval(node.value, frame)
            if _is_type_constructor(container):
                elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                literal = container == LITERAL
                annotated = container == ANNOTATED
                args = []
                for i, e in enumerate(elts):
                    if literal or (annotated and i > 0):
                        args.append(self.eval(e, frame))
                    else:
                        args.append(self.eval_annotation(e, frame))
                return make_type(container, tuple(args))
        value = self.eval(node, frame)
        return NONE_TYPE if value is None else value

    # -- builtins --------------------------------------------------------------------------
    def builtin(self, name: str) -> Any:
        if name in _BUILTIN_FUNCS:
            return Builtin(name, _BUILTIN_FUNCS[name])
        if name in ("int", "str", "float", "bool", "list", "dict", "tuple", "set", "frozenset",
                    "type", "bytes", "object"):
            return getattr(builtins, name)
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        if name == "Ellipsis":
            return Ellipsis
        if name in ("ValueError", "TypeError", "KeyError", "Exception", "RuntimeError",
                    "NotImplementedError", "ImportError", "AttributeError"):
            return Ext(f"builtins.{name}")
        return None


# -- types -----------------------------------------------------------------------------------
def _is_type_constructor(value: Any) -> bool:
    if isinstance(value, Ext):
        return value.name in ("typing.Literal", "typing.Union", "typing.Optional",
                              "typing.Annotated", "typing.ClassVar", "typing.Final",
                              "typing.Callable", "typing.Sequence", "typing.Mapping",
                              "typing.Iterable", "typing.Required", "typing.NotRequired") \
            or value.name.startswith("collections.abc.")
    return value in (list, dict, tuple, set, frozenset, type)


def make_type(container: Any, args: tuple[Any, ...]) -> Any:
    args = tuple(NONE_TYPE if a is None else a for a in args)
    if isinstance(container, Ext):
        if container.name == "typing.Optional":
            return union_of([args[0], NONE_TYPE])
        if container.name == "typing.Union":
            return union_of(list(args))
        if container.name == "typing.Literal":
            flat: list[Any] = []
            for a in args:
                if isinstance(a, TypeForm) and a.origin == LITERAL:
                    flat.extend(a.args)
                else:
                    flat.append(a)
            return TypeForm(LITERAL, tuple(flat))
        if container.name in ("typing.ClassVar", "typing.Final", "typing.Required",
                              "typing.NotRequired"):
            return args[0]
        return TypeForm(container, args)
    return TypeForm(container, args, module="builtins")


def union_of(members: list[Any]) -> Any:
    flat: list[Any] = []
    for m in members:
        m = NONE_TYPE if m is None else m
        parts = m.args if isinstance(m, TypeForm) and m.origin == UNION else (m,)
        for p in parts:
            if not any(p is q or (_hashable(p) and _hashable(q) and p == q) for q in flat):
                flat.append(p)
    if len(flat) == 1:
        return flat[0]
    return TypeForm(UNION, tuple(flat))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _is_type_like(value: Any) -> bool:
    """A type in an annotation (`X | None` is a union only when one side is a type)."""
    return (isinstance(value, type | TypeForm | ClassVal)
            or (isinstance(value, Ext) and value.module in _TYPING_MODULES | {"torch", "builtins"}))


def _is_plain(value: Any) -> bool:
    if isinstance(value, list | tuple | set | frozenset):
        return all(_is_plain(v) or _is_marker(v) for v in value)
    if isinstance(value, dict):
        return all((_is_plain(k) or _is_marker(k)) and (_is_plain(v) or _is_marker(v))
                   for k, v in value.items())
    return isinstance(value, _PLAIN) or value is Ellipsis or isinstance(value, range | slice)


def _is_marker(value: Any) -> bool:
    return isinstance(value, Ext | Opaque | TypeForm | ClassVal | FuncVal | EnumMember | Instance)


def _is_str_enum(cls: ClassVal, ev: SourceEval) -> bool:
    return ev.inherits(cls, ("StrEnum", "str"))


def _as_load(target: ast.expr) -> ast.expr:
    copy = ast.parse(ast.unparse(target), mode="eval").body
    return ast.copy_location(copy, target)


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.name == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name and stmt.value is not None
    return False


def _sort_key(value: Any) -> tuple[int, str]:
    if value is None:
        return (0, "")
    if isinstance(value, bool):
        return (1, str(value))
    if isinstance(value, int | float):
        return (2, f"{value:030.6f}")
    if isinstance(value, str):
        return (3, value)
    if isinstance(value, EnumMember):
        return (4, value.name)
    return (5, repr(value))


def _safe_set(items: list[Any]) -> Any:
    try:
        return set(items)
    except TypeError:
        return [Unknown("set of unhashable values")]


def display_callable(value: Any) -> str:
    """How a `type=` converter is written in a flag table: int, json.loads,
    optional_type(int), the lambda's source."""
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, Ext):
        return value.name.removeprefix("builtins.")
    if isinstance(value, Opaque):
        return value.label
    if isinstance(value, FuncVal):
        return value.display()
    if isinstance(value, BoundMethod):
        return value.func.display()
    if isinstance(value, ClassVal):
        return value.name
    if isinstance(value, Instance):
        return value.cls.name
    if isinstance(value, Unknown):
        return f"<unresolved: {value.source}>"
    if isinstance(value, TypeForm):
        return type_text(value)
    return repr(value)


def type_text(value: Any) -> str:
    if isinstance(value, TypeForm):
        origin = value.origin
        name = origin.__name__ if isinstance(origin, type) else str(getattr(origin, "name", origin))
        name = name.removeprefix("typing.")
        return f"{name}[{', '.join(type_text(a) if not isinstance(a, str) else repr(a) for a in value.args)}]"
    if value is NONE_TYPE:
        return "None"
    return display_callable(value)


# -- builtin functions ----------------------------------------------------------------------
def _b_len(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if args and isinstance(args[0], str | list | tuple | dict | set | frozenset) \
            and not is_unresolved(args[0]):
        return len(args[0])
    return Unknown("len(...)")


def _b_sorted(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    items = ev.iterate(args[0]) if args else None
    if items is None or is_unresolved(items) or "key" in kwargs:
        return Unknown("sorted(...)")
    try:
        return sorted(items, reverse=bool(kwargs.get("reverse", False)))
    except TypeError:
        return sorted(items, key=_sort_key, reverse=bool(kwargs.get("reverse", False)))


def _b_any_all(which: Callable[[Iterable[Any]], bool]) -> BuiltinFn:
    def fn(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        items = ev.iterate(args[0]) if args else None
        if items is None:
            return Unknown("any/all(...)")
        truths = [ev.truth(i) for i in items]
        if any(isinstance(t, Unknown) for t in truths):
            return Unknown("any/all(...)")
        return which(truths)
    return fn


def _b_isinstance(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) != 2:
        return Unknown("isinstance(...)")
    value, kinds = args
    kinds_list = list(kinds) if isinstance(kinds, tuple) else [kinds]
    if isinstance(value, Unknown):
        return Unknown("isinstance(...)")
    if all(isinstance(k, type) for k in kinds_list) and _is_plain(value):
        return isinstance(value, tuple(kinds_list))
    if isinstance(value, Instance):
        names = [k.name if isinstance(k, ClassVal | Ext) else getattr(k, "__name__", "") for k in kinds_list]
        if ev.inherits(value.cls, names):
            return True
        if all(isinstance(k, ClassVal) for k in kinds_list):
            return False
    return Unknown("isinstance(...)")


def _b_getattr(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) >= 2 and isinstance(args[1], str):
        value = ev.getattr(args[0], args[1])
        if isinstance(value, Unknown) and len(args) == 3:
            return args[2] if isinstance(args[0], Instance | ClassVal | Module) else value
        return value
    return Unknown("getattr(...)")


def _b_type(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) == 1:
        if isinstance(args[0], _PLAIN):
            return type(args[0])
        if isinstance(args[0], Instance):
            return args[0].cls
    return Unknown("type(...)")


def _b_enumerate(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    items = ev.iterate(args[0]) if args else None
    start = args[1] if len(args) > 1 else kwargs.get("start", 0)
    return Unknown("enumerate(...)") if items is None else [(start + i, v) for i, v in enumerate(items)]


def _b_zip(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    lists = [ev.iterate(a) for a in args]
    if any(v is None for v in lists):
        return Unknown("zip(...)")
    return [tuple(t) for t in zip(*lists, strict=False)]


def _b_range(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if all(isinstance(a, int) for a in args):
        return range(*args)
    return Unknown("range(...)")


def _b_minmax(which: Callable[..., Any]) -> BuiltinFn:
    def fn(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        items = args if len(args) > 1 else (ev.iterate(args[0]) if args else None)
        if not items or is_unresolved(items) or kwargs:
            return Unknown("min/max(...)")
        return which(items)
    return fn


def _b_super(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) == 2 and isinstance(args[0], ClassVal):
        return SuperVal(args[0], args[1])
    return Unknown("super(...)")


def _b_next(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    items = ev.iterate(args[0]) if args else None
    if items:
        return items[0]
    if items is not None and len(args) > 1:
        return args[1]
    return Unknown("next(...)")


def _b_ignore(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    return None


def _b_repr(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    return repr(args[0]) if args and _is_plain(args[0]) else Unknown("repr(...)")


def _b_hasattr(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) == 2 and isinstance(args[1], str) and isinstance(args[0], Instance | ClassVal | Module):
        return not isinstance(ev.getattr(args[0], args[1]), Unknown)
    return Unknown("hasattr(...)")


def _b_reversed(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    items = ev.iterate(args[0]) if args else None
    return Unknown("reversed(...)") if items is None else list(reversed(items))


def _b_callable(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if len(args) != 1 or isinstance(args[0], Unknown):
        return Unknown("callable(...)")
    value = args[0]
    if isinstance(value, FuncVal | BoundMethod | Builtin | ClassVal | Opaque | type):
        return True
    if isinstance(value, Instance):
        return not isinstance(ev.class_lookup(value.cls, "__call__"), Unknown)
    if _is_plain(value):
        return False
    return Unknown("callable(...)")


_BUILTIN_FUNCS: dict[str, BuiltinFn] = {
    "callable": _b_callable,
    "len": _b_len, "sorted": _b_sorted, "any": _b_any_all(any), "all": _b_any_all(all),
    "isinstance": _b_isinstance, "getattr": _b_getattr, "enumerate": _b_enumerate,
    "zip": _b_zip, "range": _b_range, "min": _b_minmax(min), "max": _b_minmax(max),
    "super": _b_super, "next": _b_next, "print": _b_ignore, "repr": _b_repr,
    "hasattr": _b_hasattr, "reversed": _b_reversed, "iter": lambda ev, a, k: a[0] if a else None,
}


def _c_sequence(kind: type) -> BuiltinFn:
    def fn(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not args:
            return kind()
        items = ev.iterate(args[0])
        if items is None:
            return Unknown(f"{kind.__name__}(...)")
        if kind in (set, frozenset):
            made = _safe_set(items)
            return made if kind is set or not isinstance(made, set) else frozenset(made)
        return kind(items)
    return fn


def _c_dict(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
    out: dict[Any, Any] = {}
    if args:
        source = args[0]
        if isinstance(source, dict):
            out.update(source)
        else:
            items = ev.iterate(source)
            if items is None:
                return Unknown("dict(...)")
            for pair in items:
                if not isinstance(pair, tuple | list) or len(pair) != 2:
                    return Unknown("dict(...)")
                out[pair[0]] = pair[1]
    out.update(kwargs)
    return out


def _c_scalar(kind: type) -> BuiltinFn:
    def fn(ev: SourceEval, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if not args:
            return kind()
        value = args[0]
        if isinstance(value, EnumMember) and kind is str:
            return value.value if isinstance(value.value, str) else f"{value.cls.name}.{value.name}"
        if isinstance(value, EnumMember) and kind is int and isinstance(value.value, int):
            return value.value
        if not isinstance(value, str | int | float | bool | NONE_TYPE) or kwargs:
            return Unknown(f"{kind.__name__}(...)")
        try:
            return kind(*args)
        except (TypeError, ValueError):
            return Unknown(f"{kind.__name__}(...)")
    return fn


_CONSTRUCTORS: dict[type, BuiltinFn] = {
    list: _c_sequence(list), tuple: _c_sequence(tuple), set: _c_sequence(set),
    frozenset: _c_sequence(frozenset), dict: _c_dict, str: _c_scalar(str),
    int: _c_scalar(int), float: _c_scalar(float), bool: _c_scalar(bool),
    type: _b_type,
}


# -- from recorded add_argument calls to flag entries ----------------------------------------
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count",
                     "help", "version", "BooleanOptionalAction"}
_ARGPARSE_ACTIONS = {
    "argparse.BooleanOptionalAction": "BooleanOptionalAction",
    "argparse._StoreTrueAction": "store_true", "argparse._StoreFalseAction": "store_false",
    "argparse._StoreConstAction": "store_const", "argparse._AppendAction": "append",
    "argparse._StoreAction": "store", "argparse._CountAction": "count",
    "argparse._ExtendAction": "extend",
}


def action_of(ev: SourceEval, value: Any) -> tuple[str, str | None, Any]:
    """(the action's name, the argparse action it builds on, the nargs its __init__
    defaults to) for an `action=` value."""
    if value is None:
        return "store", None, None
    if isinstance(value, str):
        return value, None, None
    base: str | None = None
    if isinstance(value, Ext):
        base = _ARGPARSE_ACTIONS.get(value.name)
        return (base or value.name.rpartition(".")[2]), None, None
    if isinstance(value, ClassVal):
        for ancestor in ev.mro(value):
            if isinstance(ancestor, Ext) and ancestor.name in _ARGPARSE_ACTIONS:
                base = _ARGPARSE_ACTIONS[ancestor.name]
                break
        init = ev.class_lookup(value, "__init__")
        nargs_default: Any = None
        if isinstance(init, FuncVal) and not isinstance(init.node, ast.Lambda):
            spec = init.node.args
            params = [*spec.posonlyargs, *spec.args]
            defaults = spec.defaults
            offset = len(params) - len(defaults)
            for i, param in enumerate(params):
                if param.arg == "nargs" and i >= offset:
                    default = defaults[i - offset]
                    if isinstance(default, ast.Constant):
                        nargs_default = default.value
            for param, kw_default in zip(spec.kwonlyargs, spec.kw_defaults, strict=True):
                if param.arg == "nargs" and isinstance(kw_default, ast.Constant):
                    nargs_default = kw_default.value
        return value.name, base, nargs_default
    return display_callable(value), None, None


def custom_action_options(ev: SourceEval, cls: ClassVal, names: list[str], expanded: list[str],
                          dest: str, kwargs: dict[str, Any]) -> list[str]:
    """The option strings a release's own Action subclass ends up with: its __init__ runs
    on an instance that already holds what argparse's base __init__ would have set."""
    init = ev.class_lookup(cls, "__init__")
    if not isinstance(init, FuncVal):
        return expanded
    instance = Instance(cls, {"option_strings": list(expanded), "dest": dest})
    passed = {k: v for k, v in kwargs.items() if k not in ("action", "dest") and not k.startswith("**")}
    ev.call_function(init, [instance], {"option_strings": list(names), "dest": dest, **passed},
                     f"{cls.name}()")
    final = instance.attrs.get("option_strings")
    if isinstance(final, list) and final and all(isinstance(o, str) for o in final):
        return list(final)
    return expanded


def _plain_json(value: Any) -> Any:
    if isinstance(value, EnumMember):
        return value.value if isinstance(value.value, str | int | float | bool) else value.name
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    if isinstance(value, set | frozenset):
        return [_plain_json(v) for v in sorted(value, key=_sort_key)]
    return display_callable(value)


def flag_entries(ev: SourceEval, parser: ParserRecorder) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The recorded add_argument calls as flag entries keyed by canonical option string
    (the first long one), and the positional arguments in order."""
    flags: dict[str, Any] = {}
    positionals: list[dict[str, Any]] = []
    for argument in parser.arguments:
        names = [a for a in argument.args if isinstance(a, str)]
        kw = argument.kwargs
        unresolved_kwargs = sorted(k for k in kw if k.startswith("**"))
        action_value = kw.get("action")
        try:
            action_value = parser.registry.get(("action", action_value), action_value)
        except TypeError:
            pass
        action, action_base, nargs_default = action_of(ev, action_value)
        nargs = kw.get("nargs", nargs_default)
        entry: dict[str, Any] = {"source": argument.where}
        if names and not names[0].startswith("-"):
            entry.update({"name": names[0], "nargs": _plain_json(nargs),
                          "type": display_callable(kw["type"]) if "type" in kw else None})
            positionals.append(entry)
            continue
        option_strings: list[str] = []
        negatable = "BooleanOptionalAction" in (action, action_base)
        for name in names:  # argparse's BooleanOptionalAction puts --no-X right after --X
            option_strings.append(name)
            if negatable and name.startswith("--"):
                option_strings.append("--no-" + name[2:])
        long_names = [o for o in names if o.startswith("--")]
        dest = kw.get("dest")
        if not isinstance(dest, str):
            first = long_names[0] if long_names else names[0]
            dest = first.lstrip("-").replace("-", "_")
        if isinstance(action_value, ClassVal):
            option_strings = custom_action_options(ev, action_value, names, option_strings, dest, kw)
        kind = action_base or action
        takes_value = kind not in _NO_VALUE_ACTIONS and nargs != 0
        entry.update({"option_strings": option_strings, "dest": dest, "action": action})
        if action_base and action_base != action:
            entry["action_base"] = action_base
        entry["takes_value"] = takes_value
        if takes_value:
            converter = kw.get("type")
            entry["type"] = display_callable(converter) if converter is not None else "str"
            entry["nargs"] = _plain_json(nargs)
        if ("const" in kw and not takes_value) or nargs == "?":
            if "const" in kw:
                entry["const"] = _plain_json(kw["const"])
        choices = kw.get("choices")
        if choices is not None:
            if is_unresolved(choices) or not isinstance(choices, list | tuple | set | frozenset | dict):
                entry["choices"] = None
                entry["choices_source"] = _unresolved_text(choices)
            else:
                values = list(choices.keys()) if isinstance(choices, dict) else choices
                entry["choices"] = _plain_json(values)
                if isinstance(choices, set | frozenset):
                    entry["choices_unordered"] = True  # a set: argparse lists it in hash order
        metavar = kw.get("metavar")
        if isinstance(metavar, list | tuple) and not is_unresolved(metavar):
            entry["metavar"] = _plain_json(metavar)  # shown in help, not enforced by argparse
        if kw.get("required") is True:
            entry["required"] = True
        deprecated = kw.get("deprecated")
        if deprecated is True:
            entry["deprecated"] = True
        extra = {k: _plain_json(v) for k, v in kw.items()
                 if k in ("new_flag", "error_message", "const_value") and not isinstance(v, Unknown)}
        if extra:
            entry["action_kwargs"] = extra
        if unresolved_kwargs:
            entry["unresolved_kwargs"] = [k[2:] for k in unresolved_kwargs]
        if argument.condition:
            entry["condition"] = argument.condition
        if argument.origin:
            entry["origin"] = argument.origin
        key = long_names[0] if long_names else names[0]
        if key in flags:
            ev.note(f"{argument.where}: {key} registered twice (argparse would refuse); "
                    "the later registration is kept")
        flags[key] = entry
    return flags, positionals


def _unresolved_text(value: Any) -> str:
    if isinstance(value, Unknown):
        return value.source
    parts = sorted({v.source for v in _walk_unknowns(value)})
    return "; ".join(parts) if parts else display_callable(value)


def _walk_unknowns(value: Any) -> Iterator[Unknown]:
    if isinstance(value, Unknown):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_unknowns(k)
            yield from _walk_unknowns(v)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from _walk_unknowns(v)


