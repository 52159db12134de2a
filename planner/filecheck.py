"""One validation layer for every file and name the planner, runtime and profiler read.

A small typed layer of our own rather than pydantic or jsonschema: it imports in about half a
millisecond from bytecode, where importing pydantic v2 and defining one strict model takes
~300 ms and jsonschema ~70 ms (measured on the 2-core dev VM; `plan` answers in ~1.1 s in
all), and each failure is one line naming the file, the key path, what was expected and what
was found:

    cluster file c.json: memory_gib must be a number, got "80" (a string)
    cluster file c.json: unknown key "internode_gbps" (did you mean 'internode_gbps_per_gpu'?);
        known: name, num_gpus, ...

Pieces:

* `read_json(path, what)`: a regular file of bounded size (no FIFO, device or directory), UTF-8,
  JSON with finite numbers only (NaN / Infinity refused), no duplicate keys, nested at most
  `MAX_DEPTH` deep.
* checkers (`Int`, `Num`, `Bool`, `Str`, `Name`, `Enum`, `List`, `Map`, `IntKey`, `Obj`,
  `Nullable`, `Anything`): `checker(value, path)` returns the value or raises `Invalid` (a BadInput);
  `check(checker, value, what)` puts "what: " in front.
* `check_name(s, what)`: a name that may reach a shell line or a config file (no control or
  line-separator characters, bounded length). Quote it as well: `shlex.quote` in shell lines,
  `toml_string` / `json.dumps` in configs.

Model, GPU, cluster, plan and profile schemas sit beside their types (planner.specs,
planner.plan, planner.profile) and are built from these checkers.
"""
from __future__ import annotations

import json
import math
import os
import stat

from planner.errors import BadInput

MAX_DEPTH = 32
# Bytes per file kind; a generous multiple of the largest real file of each kind.
MAX_BYTES = {"model config": 4 << 20, "cluster file": 1 << 20, "plan": 16 << 20,
             "profile": 64 << 20}
DEFAULT_MAX_BYTES = 16 << 20
MAX_NAME = 200
MAX_PATH = 4096
MAX_STR = 100_000


class Invalid(BadInput):
    """A value that fails its schema: `path` (dotted keys, [i] for items) and the message."""

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path} {message}" if path else message)


# ---- describing what was found (one short line, no raw control characters) -----------------

def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def show(v, limit: int = 40) -> str:
    """`v` as a user would recognise it, shortened: repr for scalars (escapes control
    characters), the kind for containers, the digit count for huge integers."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        s = str(v) if abs(v) < 10 ** 18 else f"a {len(str(abs(v)))}-digit integer"
        return s
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        r = json.dumps(v if len(v) <= limit else v[:limit] + "...")
        return f"{r} (a string)"
    if isinstance(v, (list, dict)):
        return f"{_kind(v)} of {len(v)}"
    return _kind(v)


def _key(k) -> str:
    k = str(k)
    return json.dumps(k if len(k) <= 40 else k[:40] + "...")


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    k = str(key)
    if len(k) > 40 or bad_name_reason(k) is not None:
        k = _key(k)
    return f"{path}.{k}" if path else k


# ---- checkers --------------------------------------------------------------------------------

class Checker:
    def __call__(self, v, path: str = ""):
        raise NotImplementedError

    def describe(self) -> str:
        return "a value"


class Anything(Checker):
    def __call__(self, v, path=""):
        return v


class Int(Checker):
    """An integer (not a boolean, not a float such as 8.0 or 8.7) in [lo, hi]."""

    def __init__(self, lo=None, hi=None):
        self.lo, self.hi = lo, hi

    def describe(self):
        return "an integer"

    def __call__(self, v, path=""):
        if isinstance(v, bool) or not isinstance(v, int):
            raise Invalid(path, f"must be an integer, got {show(v)}")
        if self.lo is not None and v < self.lo:
            raise Invalid(path, f"must be at least {self.lo}, got {show(v)}")
        if self.hi is not None and v > self.hi:
            raise Invalid(path, f"must be at most {self.hi}, got {show(v)}")
        return v


class Num(Checker):
    """A finite number (integer or float, not a boolean) in its range; returned as float.
    `gt` / `lt` are open bounds, `ge` / `le` closed ones."""

    def __init__(self, ge=None, gt=None, le=None, lt=None):
        self.ge, self.gt, self.le, self.lt = ge, gt, le, lt

    def describe(self):
        return "a number"

    def __call__(self, v, path=""):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Invalid(path, f"must be a number, got {show(v)}")
        if isinstance(v, int) and abs(v) > 1e300:
            raise Invalid(path, f"must be a finite number of sensible size, got {show(v)}")
        x = float(v)
        if not math.isfinite(x):
            raise Invalid(path, f"must be a finite number, got {show(v)}")
        if self.gt is not None and not x > self.gt:
            raise Invalid(path, f"must be greater than {self.gt:g}, got {show(v)}")
        if self.ge is not None and not x >= self.ge:
            raise Invalid(path, f"must be at least {self.ge:g}, got {show(v)}")
        if self.lt is not None and not x < self.lt:
            raise Invalid(path, f"must be less than {self.lt:g}, got {show(v)}")
        if self.le is not None and not x <= self.le:
            raise Invalid(path, f"must be at most {self.le:g}, got {show(v)}")
        return x


class Bool(Checker):
    """true or false, nothing else ("no", 0 and "false" are refused, not taken as truthy)."""

    def describe(self):
        return "true or false"

    def __call__(self, v, path=""):
        if not isinstance(v, bool):
            raise Invalid(path, f"must be true or false, got {show(v)}")
        return v


class Str(Checker):
    def __init__(self, max_len: int = MAX_STR, min_len: int = 0):
        self.max_len, self.min_len = max_len, min_len

    def describe(self):
        return "a string"

    def __call__(self, v, path=""):
        if not isinstance(v, str):
            raise Invalid(path, f"must be a string, got {show(v)}")
        if len(v) > self.max_len:
            raise Invalid(path, f"must be at most {self.max_len} characters, got {len(v)}")
        if len(v) < self.min_len:
            raise Invalid(path, "must not be empty")
        return v


def bad_name_reason(s, max_len: int = MAX_NAME) -> str | None:
    """Why `s` cannot be a name that reaches shell or config text, or None if it can."""
    if not isinstance(s, str):
        return f"must be a string, got {show(s)}"
    if not s.strip():
        return "must not be empty"
    if len(s) > max_len:
        return f"must be at most {max_len} characters, got {len(s)}"
    for ch in s:
        o = ord(ch)
        # C0 and C1 controls, DEL, and the Unicode line / paragraph separators
        if o < 0x20 or 0x7f <= o <= 0x9f or o in (0x2028, 0x2029, 0x85):
            return f"must not contain control characters (found {ch!r} in {show(s)})"
    return None


class Name(Checker):
    """A name: a non-empty string of at most MAX_NAME characters without control characters."""

    def describe(self):
        return "a name"

    def __call__(self, v, path=""):
        why = bad_name_reason(v)
        if why:
            raise Invalid(path, why)
        return v


def check_name(s, what: str = "name", max_len: int = MAX_NAME) -> str:
    """`s` if it is a safe name; else BadInput "<what> must not contain control characters".
    For names a user typed that reach shell lines or config files (model, cluster and GPU
    names, job names; paths with max_len=MAX_PATH): call it, then quote (`shlex.quote`,
    `toml_string`)."""
    why = bad_name_reason(s, max_len)
    if why:
        raise BadInput(f"{what} {why}")
    return s


def toml_string(s: str) -> str:
    """A TOML basic string holding `s` exactly (JSON's escapes are valid TOML escapes for
    every character json.dumps escapes with ensure_ascii)."""
    return json.dumps(str(s), ensure_ascii=True)


class Enum(Checker):
    def __init__(self, *choices):
        self.choices = choices

    def describe(self):
        return "one of " + ", ".join(json.dumps(c) for c in self.choices)

    def __call__(self, v, path=""):
        # bool is an int: true must not pass for 1, nor 1.0 for 1
        for c in self.choices:
            if type(v) is type(c) and v == c:
                return v
        raise Invalid(path, f"must be {self.describe()}, got {show(v)}")


class Nullable(Checker):
    def __init__(self, inner: Checker):
        self.inner = inner

    def __call__(self, v, path=""):
        return None if v is None else self.inner(v, path)


class List(Checker):
    def __init__(self, item: Checker, min_len: int = 0, max_len: int | None = None):
        self.item, self.min_len, self.max_len = item, min_len, max_len

    def describe(self):
        return "a list"

    def __call__(self, v, path=""):
        if not isinstance(v, list):
            raise Invalid(path, f"must be a list, got {show(v)}")
        if len(v) < self.min_len:
            raise Invalid(path, f"must have at least {self.min_len} item(s), got {len(v)}")
        if self.max_len is not None and len(v) > self.max_len:
            raise Invalid(path, f"must have at most {self.max_len} items, got {len(v)}")
        return [self.item(x, _join(path, i)) for i, x in enumerate(v)]


class Map(Checker):
    """An object with arbitrary keys (checked by `key`, a checker of strings) and values."""

    def __init__(self, value: Checker, key: Checker | None = None, max_len: int | None = None,
                 min_len: int = 0):
        self.value, self.key, self.max_len, self.min_len = value, key, max_len, min_len

    def describe(self):
        return "an object"

    def __call__(self, v, path=""):
        if not isinstance(v, dict):
            raise Invalid(path, f"must be an object, got {show(v)}")
        if self.max_len is not None and len(v) > self.max_len:
            raise Invalid(path, f"must have at most {self.max_len} keys, got {len(v)}")
        if len(v) < self.min_len:
            raise Invalid(path, f"must have at least {self.min_len} key(s)")
        out = {}
        for k, x in v.items():
            if self.key is not None:
                self.key(k, _join(path, "<key>"))
            out[k] = self.value(x, _join(path, k))
        return out


class IntKey(Checker):
    """A key that spells a positive integer ("8"), as JSON writes integer keys."""

    def __init__(self, lo: int = 1, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def __call__(self, v, path=""):
        if not (isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 12):
            raise Invalid(path, f"must be a positive integer written as a key, got {show(v)}")
        n = int(v)
        if n < self.lo or (self.hi is not None and n > self.hi):
            raise Invalid(path, f"must be in {self.lo}..{self.hi}, got {v}")
        return v


REQUIRED = object()


class Obj(Checker):
    """An object with known keys: {key: checker} or {key: (checker, default)}; a key without a
    default is required. Unknown keys are refused with the known ones listed unless `extra`
    (a checker for their values, or True for anything)."""

    def __init__(self, fields: dict, extra=False, fill_defaults: bool = False):
        self.fields = {}
        for k, spec in fields.items():
            if isinstance(spec, tuple):
                self.fields[k] = spec
            else:
                self.fields[k] = (spec, REQUIRED)
        self.extra = Anything() if extra is True else extra
        self.fill_defaults = fill_defaults

    def describe(self):
        return "an object"

    def __call__(self, v, path=""):
        if not isinstance(v, dict):
            raise Invalid(path, f"must be an object, got {show(v)}")
        if not self.extra:
            unknown = [k for k in v if k not in self.fields]
            if unknown:
                raise Invalid("", unknown_keys_message(unknown, self.fields, path))
        missing = [k for k, (_, d) in self.fields.items() if d is REQUIRED and k not in v]
        if missing:
            keys = ("field " if len(missing) == 1 else "fields ") + ", ".join(
                repr(k) for k in missing)
            raise Invalid("", f"{path} is missing {keys}" if path else f"missing {keys}")
        out = {}
        for k, x in v.items():
            spec = self.fields.get(k)
            checker = spec[0] if spec else self.extra
            out[k] = checker(x, _join(path, k))
        if self.fill_defaults:
            for k, (_, d) in self.fields.items():
                if k not in out and d is not REQUIRED:
                    out[k] = d
        return out


def unknown_keys_message(unknown, known, path: str = "") -> str:
    """"[path has] unknown key 'x' (did you mean 'y'?); known: a, b, c"."""
    import difflib
    first = unknown[0]
    what = ("unknown keys " + ", ".join(_key(k) for k in unknown[:5])
            + (", ..." if len(unknown) > 5 else "")) if len(unknown) > 1 else \
        f"unknown key {_key(first)}"
    close = difflib.get_close_matches(str(first)[:100], [str(k) for k in known], n=1,
                                      cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    msg = f"{what}{hint}; known: {', '.join(known)}"
    return f"{path} has {msg}" if path else msg


def check(checker: Checker, value, what: str):
    """`checker(value)`, its failure as one line "what: path message"."""
    try:
        return checker(value, "")
    except Invalid as e:
        raise BadInput(f"{what}: {e}") from None


# ---- reading JSON files ----------------------------------------------------------------------

def _no_constant(name):
    raise ValueError(f"{name} is not a finite number")


class _Duplicate(ValueError):
    pass


def _pairs(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(f"duplicate key {k!r}")
            seen.add(k)
    return d


def depth_exceeds(d, limit: int = MAX_DEPTH) -> bool:
    """Whether the parsed JSON value `d` nests containers deeper than `limit` (iterative)."""
    stack = [(d, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))
    return False


def loads(text: str, where: str, max_depth: int = MAX_DEPTH):
    """Parse JSON text strictly (see read_json); BadInput "where: ..." on any fault."""
    try:
        d = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_pairs)
    except _Duplicate as e:
        raise BadInput(f"{where}: not valid JSON ({e})") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{where}: not valid JSON (line {e.lineno} column {e.colno}: "
                       f"{e.msg})") from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as e:            # NaN / Infinity, an integer of > 4300 digits
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"{where}: not valid JSON ({msg[:120]})") from None
    if depth_exceeds(d, max_depth):
        raise BadInput(f"{where}: JSON nested deeper than {max_depth} levels")
    return d


def read_text(path, what: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; BadInput naming `what`."""
    limit = max_bytes or MAX_BYTES.get(what, DEFAULT_MAX_BYTES)
    where = f"{what} {show_path(path)}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput(f"{where}: no such file") from None
    except (OSError, ValueError) as e:          # ValueError: an embedded NUL
        raise BadInput(f"{where}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{where}: cannot read (is a directory)")
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{where}: cannot read (not a regular file)")
    if st.st_size > limit:
        raise BadInput(f"{where}: {st.st_size} bytes, more than the {limit} a {what} may have")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise BadInput(f"{where}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise BadInput(f"{where}: more than the {limit} bytes a {what} may have")
    try:
        return data.decode("utf-8-sig")          # a byte-order mark, as some editors write
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 text (byte {e.start})") from None


def read_json(path, what: str, max_bytes: int | None = None, max_depth: int = MAX_DEPTH):
    """A JSON value from a file, strictly: see the module docstring."""
    text = read_text(path, what, max_bytes)
    return loads(text, f"{what} {show_path(path)}", max_depth)


def read_json_object(path, what: str, max_bytes: int | None = None) -> dict:
    d = read_json(path, what, max_bytes)
    if not isinstance(d, dict):
        raise BadInput(f"{what} {show_path(path)}: not a {what} (expected a JSON object, "
                       f"got {_kind(d)})")
    return d


def show_path(path) -> str:
    """A path for a message: as typed when printable, else repr-escaped (one line)."""
    s = str(path)
    if bad_name_reason(s) is None or (s.strip() and len(s) > MAX_NAME
                                      and bad_name_reason(s[:MAX_NAME]) is None):
        return s if len(s) <= 300 else s[:300] + "..."
    return repr(s)[:300]
