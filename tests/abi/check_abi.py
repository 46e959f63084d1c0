#!/usr/bin/env python3
"""ABI conformance checker: the simulator's public headers against the real CANN
headers shipped in the torch-npu wheel.

For everything the shim headers declare it compares, with libclang:
  - functions: return type, each parameter type (typedefs resolved; enums and
    structs compared by name; pointee const-ness counts; parameter names and
    top-level qualifiers do not), variadic-ness, prototype vs `()`;
  - typedefs: the resolved underlying type;
  - enums: tag, underlying integer type, size, and every shim enumerator's value
    (each must exist in the same real enum; the real enum may have more);
  - structs/unions: completeness, size, alignment, each field's offset, type and
    bit-field width, fields present on one side only;
  - constants (object-like integer macros and `static const` variables): value,
    type, and macro-vs-variable kind;
  - placement: a symbol declared by shim header H must be visible to a program
    that includes the real H.
Every number libclang reports (sizes, alignments, offsets, enumerator and
constant values) is then re-derived by compiling and running probe programs
with gcc/g++ for both header sets; any disagreement is a checker error.

Symbols the public headers do not declare must be listed in the allow-list
(tests/abi/not-in-wheel.txt) together with a reference declaration, which is
compared like any other.

Exit status: 0 conformant; 1 differences (one "DIFF" line each on stdout);
2 the checker could not do its job (errors on stderr and "ERROR" lines).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    import clang.cindex as ci
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("check_abi: the libclang Python package is not installed (run tests/abi/check-abi.sh)\n")
    sys.exit(2)

CK = ci.CursorKind
TK = ci.TypeKind


class CheckerError(Exception):
    pass


# Real header sets, relative to torch_npu/include. hccl.h/hccl_types.h are not
# valid C (namespace-scope `const uint32_t` used as an array bound, `nullptr`,
# untagged union use), so headers that fail to parse as C are read as C++, which
# is how torch_npu itself compiles them.
REAL_GLOBS = [
    ("acl", ".h"),
    ("acl/error_codes", ".h"),
    ("acl/ops", ".h"),
    ("third_party/hccl/inc/hccl", ".h"),
]
# Which real header a shim header stands in for (prefix mapping).
COUNTERPART_PREFIX = [("acl/", "acl/"), ("hccl/", "third_party/hccl/inc/hccl/")]

BUILTIN_NAMES = {
    TK.VOID: "void", TK.BOOL: "bool", TK.CHAR_S: "char", TK.CHAR_U: "char",
    TK.SCHAR: "signed char", TK.UCHAR: "unsigned char", TK.SHORT: "short",
    TK.USHORT: "unsigned short", TK.INT: "int", TK.UINT: "unsigned int",
    TK.LONG: "long", TK.ULONG: "unsigned long", TK.LONGLONG: "long long",
    TK.ULONGLONG: "unsigned long long", TK.INT128: "__int128",
    TK.UINT128: "unsigned __int128", TK.FLOAT: "float", TK.DOUBLE: "double",
    TK.LONGDOUBLE: "long double", TK.WCHAR: "wchar_t", TK.CHAR16: "char16_t",
    TK.CHAR32: "char32_t", TK.HALF: "__fp16",
    TK.NULLPTR: "nullptr_t",
}
# Virtual directory of the generated translation units (never touches disk).
PROBE_DIR = "/__u3m_abi_probe__"
ARRAY_KINDS = (TK.CONSTANTARRAY, TK.INCOMPLETEARRAY, TK.VARIABLEARRAY, TK.DEPENDENTSIZEDARRAY)
RECORD_KW = {CK.ENUM_DECL: "enum", CK.STRUCT_DECL: "struct", CK.UNION_DECL: "union"}


# ----------------------------------------------------------------------------
# Type canonicalisation

def decl_tag(decl):
    """(keyword, name, tagged) for an enum/struct/union declaration. `tagged` is
    False for `typedef enum {...} X;` (clang names such a type after its typedef;
    its USR says "EA"/"SA"/"UA") and None-named for a truly anonymous one."""
    kw = RECORD_KW.get(decl.kind, "record")
    usr = decl.get_usr() or ""
    m = re.search(r"@([ESU])([Aa]?)@", usr)
    if m and m.group(2) == "a":
        return kw, None, False
    tagged = not (m and m.group(2) == "A")
    return kw, decl.spelling, tagged


def type_name_of_decl(decl):
    kw, name, _ = decl_tag(decl)
    if name is None:
        loc = decl.location
        return "%s <anonymous at %s:%d>" % (kw, os.path.basename(loc.file.name) if loc.file else "?", loc.line)
    return "%s %s" % (kw, name)


def _ptr(inner):
    return inner + ("*" if inner.endswith("*") else " *")


def canon(t, strip_top=False, extra_const=False, extra_vol=False):
    """A C-like spelling of `t` with typedefs resolved, enums/records by name."""
    t = t.get_canonical()
    k = t.kind
    const = (t.is_const_qualified() and not strip_top) or extra_const
    vol = (t.is_volatile_qualified() and not strip_top) or extra_vol
    if k == TK.POINTER:
        pt = t.get_pointee().get_canonical()
        if pt.kind in (TK.FUNCTIONPROTO, TK.FUNCTIONNOPROTO):
            # function pointer, spelled the C way: RET (*)(PARAMS)
            params = "" if pt.kind == TK.FUNCTIONNOPROTO else _params(pt)
            s = "%s (*%s%s)(%s)" % (canon(pt.get_result()), "const" if const else "",
                                   " volatile" if vol else "", params)
            return s
        s = _ptr(canon(t.get_pointee()))
        if const:
            s += "const"
        if vol:
            s += " volatile" if const else "volatile"
        return s
    if k in ARRAY_KINDS:
        # clang keeps an array's qualifiers on the array type; in C they belong
        # to the element (C11 6.7.3p9).
        n = t.element_count if k == TK.CONSTANTARRAY else ""
        return "%s[%s]" % (canon(t.element_type, extra_const=const, extra_vol=vol), n)
    if k in (TK.ENUM, TK.RECORD):
        base = type_name_of_decl(t.get_declaration())
    elif k == TK.FUNCTIONPROTO:
        base = "%s(%s)" % (canon(t.get_result()), _params(t))
    elif k == TK.FUNCTIONNOPROTO:
        base = "%s()" % canon(t.get_result())
    elif k in BUILTIN_NAMES:
        base = BUILTIN_NAMES[k]
    else:
        base = re.sub(r"\b(const|volatile|restrict)\b\s*", "", t.spelling).strip()
    quals = ("const " if const else "") + ("volatile " if vol else "")
    return quals + base


def _params(fn_type):
    params = [canon_param(a) for a in fn_type.argument_types()]
    if fn_type.is_function_variadic():
        params.append("...")
    return ", ".join(params) if params else "void"


def canon_param(t):
    """Parameter type as it enters the function type: arrays and functions decay
    to pointers, top-level qualifiers are dropped."""
    tc = t.get_canonical()
    if tc.kind in ARRAY_KINDS:
        return _ptr(canon(tc.element_type, extra_const=tc.is_const_qualified(),
                          extra_vol=tc.is_volatile_qualified()))
    if tc.kind in (TK.FUNCTIONPROTO, TK.FUNCTIONNOPROTO):
        return _ptr(canon(tc))
    return canon(t, strip_top=True)


def func_signature(cur):
    """(return, [params], variadic, has_prototype) of a FUNCTION_DECL. In C++ a
    `()` declaration is a prototype with no parameters."""
    t = cur.type
    ret = canon(cur.result_type)
    if t.kind == TK.FUNCTIONNOPROTO:
        return ret, [], False, False
    params = [canon_param(a) for a in t.argument_types()]
    return ret, params, t.is_function_variadic(), True


# ----------------------------------------------------------------------------
# Parsing and symbol tables

_GCC_INC = None


def compiler_include_dir():
    """The libclang wheel ships no builtin headers (stddef.h, stdbool.h, ...); use
    the ones of the system gcc, which clang accepts."""
    global _GCC_INC
    if _GCC_INC is None:
        cc = os.environ.get("CC", "gcc")
        try:
            _GCC_INC = subprocess.check_output([cc, "-print-file-name=include"], text=True).strip()
        except (OSError, subprocess.CalledProcessError) as e:
            raise CheckerError("cannot ask %s for its include directory: %s" % (cc, e))
    return _GCC_INC


INDEX = None


def parse(name, source, lang, include_dirs):
    # Host target, like the gcc probes: sizes and offsets are compared for the
    # machine the shim is built on.
    args = ["-x", lang, "-std=gnu11" if lang == "c" else "-std=gnu++17",
            "-isystem", compiler_include_dir()]
    for d in include_dirs:
        args += ["-I", d]
    tu = INDEX.parse(name, args=args, unsaved_files=[(name, source)],
                     options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
    return tu


def errors_of(tu):
    return [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]


_REALPATH = {}


def under(path, roots):
    if path is None:
        return False
    p = _REALPATH.get(path)
    if p is None:
        p = _REALPATH[path] = os.path.realpath(path)
    return any(p == r or p.startswith(r + os.sep) for r in roots)


class Symbols:
    """Declarations of one translation unit that come from the owned files."""

    def __init__(self, label, lang, tu, roots, root_for_names):
        self.label = label
        self.lang = lang
        self.tu = tu
        self.funcs = {}
        self.typedefs = {}
        self.tags = {}          # (kw, name) -> decl cursor (definition preferred)
        self.records = []       # enum/struct/union decls in order (one per entity)
        self.enumerators = {}   # name -> (enum decl, value)
        self.vars = {}
        self.macros = {}
        self.root_for_names = root_for_names
        self._seen_records = {}
        self._collect(tu.cursor, roots)

    def where(self, cur):
        loc = cur.location
        if loc.file is None:
            return "?"
        p = os.path.realpath(loc.file.name)
        base = self.root_for_names
        rel = os.path.relpath(p, base) if base and p.startswith(base + os.sep) else os.path.basename(p)
        return "%s:%d" % (rel, loc.line)

    def _collect(self, parent, roots):
        for c in parent.get_children():
            if c.kind in (CK.LINKAGE_SPEC, CK.UNEXPOSED_DECL):
                self._collect(c, roots)
                continue
            if not under(c.location.file.name if c.location.file else None, roots):
                continue
            k = c.kind
            if k == CK.FUNCTION_DECL:
                # In C++ only functions with C language linkage are the ABI; the
                # C++ overloads and inline wrappers (acl_rt_api.h) are not.
                if self.lang == "c++" and c.mangled_name not in (c.spelling, ""):
                    continue
                self.funcs.setdefault(c.spelling, c)
            elif k == CK.TYPEDEF_DECL:
                self.typedefs.setdefault(c.spelling, c)
            elif k in RECORD_KW:
                self._add_record(c)
            elif k == CK.VAR_DECL:
                self.vars.setdefault(c.spelling, c)
            elif k == CK.MACRO_DEFINITION:
                self.macros.setdefault(c.spelling, c)

    def _add_record(self, c):
        usr = c.get_usr()
        prev = self._seen_records.get(usr)
        if prev is not None:
            if c.is_definition() and not self.records[prev].is_definition():
                self.records[prev] = c
            else:
                return
        else:
            self._seen_records[usr] = len(self.records)
            self.records.append(c)
        kw, name, _ = decl_tag(c)
        if name is not None:
            old = self.tags.get((kw, name))
            if old is None or (c.is_definition() and not old.is_definition()):
                self.tags[(kw, name)] = c
        if c.kind == CK.ENUM_DECL and c.is_definition():
            for e in c.get_children():
                if e.kind == CK.ENUM_CONSTANT_DECL:
                    self.enumerators.setdefault(e.spelling, (c, e.enum_value))

    def all_names(self):
        names = set(self.funcs) | set(self.typedefs) | set(self.enumerators) | set(self.vars) | set(self.macros)
        names |= {"%s %s" % kn for kn in self.tags}
        return names


def record_def(c):
    d = c.get_definition()
    return d if d is not None else c


def macro_body(c):
    toks = list(c.get_tokens())
    if not toks:
        return None, []
    name = toks[0]
    body = toks[1:]
    function_like = bool(body) and body[0].spelling == "(" and \
        body[0].extent.start.line == name.extent.end.line and \
        body[0].extent.start.column == name.extent.end.column
    return function_like, [t.spelling for t in body]


# ----------------------------------------------------------------------------
# Allow-list

class AllowEntry:
    def __init__(self, lineno, kind, name, source, reference):
        self.lineno = lineno
        self.kind = kind
        self.name = name
        self.source = source
        self.reference = reference
        self.snippet = None


def read_allow_list(path):
    entries = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 3:
                raise CheckerError("%s:%d: expected `KIND NAME | SOURCE | REFERENCE`" % (path, n))
            head = parts[0].split()
            if len(head) != 2 or head[0] not in ("function", "typedef", "constant"):
                raise CheckerError("%s:%d: KIND must be function, typedef or constant, then NAME" % (path, n))
            if head[1] in entries:
                raise CheckerError("%s:%d: %s listed twice" % (path, n, head[1]))
            if not (parts[1].startswith("wheel:") or parts[1].startswith("https://")):
                raise CheckerError("%s:%d: SOURCE must be wheel:<path> or an https:// URL" % (path, n))
            if not parts[2]:
                raise CheckerError("%s:%d: empty REFERENCE" % (path, n))
            entries[head[1]] = AllowEntry(n, head[0], head[1], parts[1], parts[2])
    return entries


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def reference_snippet(e, real_root, allow_path):
    """C text declaring e.name as the reference says."""
    where = "%s:%d" % (allow_path, e.lineno)
    if e.source.startswith("wheel:"):
        rel = e.source[len("wheel:"):]
        path = os.path.join(real_root, rel)
        if not os.path.isfile(path):
            raise CheckerError("%s: %s does not exist in the fetched wheel" % (where, rel))
        m = re.fullmatch(r"typedef\s+([A-Za-z_]\w*)", e.reference)
        if not m:
            raise CheckerError("%s: a wheel reference must be `typedef <name>`" % where)
        tname = re.escape(m.group(1))
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        fp = re.search(r"\btypedef\b[^;{}]*\(\s*\*\s*%s\s*\)\s*\([^;{}]*\)\s*;" % tname, text)
        plain = re.search(r"\btypedef\b[^;{}()]*\b%s\s*;" % tname, text)
        if e.kind == "function":
            if not fp:
                raise CheckerError("%s: no function-pointer typedef %s in %s" % (where, m.group(1), rel))
            decl = re.sub(r"\(\s*\*\s*%s\s*\)" % tname, e.name, fp.group(0), count=1)
            return re.sub(r"^\s*typedef\b\s*", "", decl)
        if e.kind == "typedef":
            if not plain:
                raise CheckerError("%s: no typedef %s in %s" % (where, m.group(1), rel))
            if m.group(1) != e.name:
                raise CheckerError("%s: a typedef reference must name the typedef itself" % where)
            return plain.group(0)
        raise CheckerError("%s: constants cannot come from a wheel typedef" % where)
    if e.kind == "constant":
        return "#define %s %s" % (e.name, e.reference)
    if not re.search(r"\b%s\b" % re.escape(e.name), e.reference):
        raise CheckerError("%s: the reference declaration does not mention %s" % (where, e.name))
    return e.reference if e.reference.rstrip().endswith(";") else e.reference + ";"


# ----------------------------------------------------------------------------
# The comparison

class Report:
    def __init__(self):
        self.diffs = []
        self.notes = []
        self.errors = []
        self.ok = []

    def diff(self, msg):
        if msg not in self.diffs:
            self.diffs.append(msg)

    def note(self, msg):
        self.notes.append(msg)

    def error(self, msg):
        self.errors.append(msg)


class Checker:
    def __init__(self, shim_root, real_root, allow_path, verbose=False):
        self.shim_root = os.path.realpath(shim_root)
        self.real_root = os.path.realpath(real_root)
        self.allow_path = allow_path
        self.verbose = verbose
        self.rep = Report()
        self.counts = {}
        # numeric facts for the gcc cross-check: side -> unit label -> key -> (expr, value)
        self.facts = {"shim": {}, "real": {}}

    # -- setup ---------------------------------------------------------------

    def setup(self):
        global INDEX
        INDEX = ci.Index.create()
        self._parse_shim()
        self._parse_real()
        self._parse_reference()

    def _parse_shim(self):
        headers = []
        for dirpath, _, files in os.walk(self.shim_root):
            for fn in sorted(files):
                if fn.endswith(".h"):
                    headers.append(os.path.relpath(os.path.join(dirpath, fn), self.shim_root))
        headers.sort()
        if not headers:
            raise CheckerError("no headers under %s" % self.shim_root)
        self.shim_headers = headers
        self.shim_src = "".join('#include "%s"\n' % h for h in headers)
        self.shim_inc = [self.shim_root]
        tu = parse(PROBE_DIR + "/abi_shim_probe.c", self.shim_src, "c", self.shim_inc)
        errs = errors_of(tu)
        if errs:
            raise CheckerError("the shim headers do not parse as C:\n  " + "\n  ".join(str(d) for d in errs))
        self.shim = Symbols("shim", "c", tu, [self.shim_root], self.shim_root)

    def _parse_real(self):
        if not os.path.isfile(os.path.join(self.real_root, "acl", "acl.h")):
            raise CheckerError("%s does not look like torch_npu/include (no acl/acl.h)" % self.real_root)
        self.real_inc = [self.real_root, os.path.join(self.real_root, "third_party/hccl/inc")]
        roots = [os.path.join(self.real_root, "acl"), os.path.join(self.real_root, "third_party/hccl")]
        self.real_roots = roots
        hdrs = []
        for d, ext in REAL_GLOBS:
            full = os.path.join(self.real_root, d)
            if os.path.isdir(full):
                hdrs += sorted(os.path.join(d, f) for f in os.listdir(full) if f.endswith(ext))
        c_ok, cxx_ok = [], []
        self.visible = {}   # real header -> set of names visible when including it
        for h in hdrs:
            src = '#include "%s"\n' % h
            tu = parse(PROBE_DIR + "/abi_one.c", src, "c", self.real_inc)
            lang = "c"
            # gcc decides too: clang accepts some non-C (a const variable as an
            # array bound, hccl_types.h) that gcc, which builds the shim, rejects.
            if errors_of(tu) or not gcc_accepts_c(src, self.real_inc):
                tu = parse(PROBE_DIR + "/abi_one.cpp", src, "c++", self.real_inc)
                lang = "c++"
                if errors_of(tu):
                    self.rep.note("real header %s parses neither as C nor as C++; not used" % h)
                    continue
                self.rep.note("real header %s is not valid C; read as C++" % h)
            (c_ok if lang == "c" else cxx_ok).append(h)
            self.visible[h] = Symbols(h, lang, tu, roots, self.real_root).all_names()
        self.real_units = []
        if c_ok:
            self.real_units.append(self._real_unit("real-c", "c", c_ok))
        self.real_units.append(self._real_unit("real-c++", "c++", c_ok + cxx_ok))

    def _real_unit(self, label, lang, headers):
        src = "".join('#include "%s"\n' % h for h in headers)
        name = PROBE_DIR + ("/abi_real_probe.c" if lang == "c" else "/abi_real_probe.cpp")
        tu = parse(name, src, lang, self.real_inc)
        errs = errors_of(tu)
        if errs:
            raise CheckerError("real headers do not parse together as %s:\n  %s" % (lang, "\n  ".join(map(str, errs))))
        s = Symbols(label, lang, tu, self.real_roots, self.real_root)
        s.src, s.inc, s.fname = src, self.real_inc, name
        return s

    def _parse_reference(self):
        self.allow = read_allow_list(self.allow_path)
        order = {"typedef": 0, "function": 1, "constant": 2}
        lines = ["#include <stdbool.h>", "#include <stdint.h>", '#include "acl/acl.h"']
        self.ref_line_of = {}
        for e in sorted(self.allow.values(), key=lambda e: (order[e.kind], e.lineno)):
            e.snippet = reference_snippet(e, self.real_root, self.allow_path)
            for sl in e.snippet.splitlines():
                lines.append(sl)
                self.ref_line_of[len(lines)] = e
        src = "\n".join(lines) + "\n"
        fname = PROBE_DIR + "/abi_reference.c"
        tu = parse(fname, src, "c", self.real_inc)
        errs = errors_of(tu)
        if errs:
            msgs = []
            for d in errs:
                e = self.ref_line_of.get(d.location.line)
                msgs.append("%s (%s)" % (d.spelling, "%s:%d" % (self.allow_path, e.lineno) if e else str(d.location)))
            raise CheckerError("allow-list references do not parse:\n  " + "\n  ".join(msgs))
        self.ref = Symbols("reference", "c", tu, [fname], None)
        self.ref.src, self.ref.inc, self.ref.fname = src, self.real_inc, fname
        if self.allow and not (self.ref.funcs or self.ref.typedefs or self.ref.macros):
            raise CheckerError("allow-list references produced no declarations")

    # -- lookups -------------------------------------------------------------

    def real_lookup(self, table, name):
        for u in self.real_units:
            v = getattr(u, table).get(name)
            if v is not None:
                return v, u
        return None, None

    def counterpart(self, shim_file):
        rel = os.path.relpath(os.path.realpath(shim_file), self.shim_root)
        for sp, rp in COUNTERPART_PREFIX:
            if rel.startswith(sp):
                return rel, rp + rel[len(sp):]
        return rel, None

    def resolve(self, kind, table, name, shim_cur):
        """Find the real declaration of `name`: public headers first, then the
        allow-list reference. Reports a missing symbol; returns (cursor, unit)."""
        cur, unit = self.real_lookup(table, name)
        e = self.allow.get(name)
        if cur is not None:
            if e is not None:
                self.rep.diff("allow-list %s:%d: %s is declared by the public headers (%s); remove the entry"
                              % (self.allow_path, e.lineno, name, unit.where(cur)))
            self.check_placement(kind, name, shim_cur)
            return cur, unit
        if e is not None:
            ref_cur = getattr(self.ref, table).get(name)
            if ref_cur is None:
                self.rep.diff("%s %s: the allow-list (%s:%d) lists it as a %s, but its reference declares no %s"
                              % (kind, name, self.allow_path, e.lineno, e.kind, kind))
                return None, None
            return ref_cur, self.ref
        self.rep.diff("%s %s: declared by the shim (%s) but not by the real headers, and not in %s"
                      % (kind, name, self.shim.where(shim_cur), os.path.basename(self.allow_path)))
        return None, None

    def check_placement(self, kind, name, shim_cur, key=None):
        f = shim_cur.location.file
        if f is None:
            return
        rel, real_h = self.counterpart(f.name)
        if real_h is None:
            return
        vis = self.visible.get(real_h)
        if vis is None:
            self.rep.diff("header %s: the real headers have no %s" % (rel, real_h))
            return
        if (key or name) not in vis:
            self.rep.diff("%s %s: the shim declares it in %s, but including the real %s does not declare it"
                          % (kind, name, rel, real_h))

    # -- checks --------------------------------------------------------------

    def run(self):
        self.check_functions()
        self.check_typedefs()
        self.check_records()
        self.check_constants()
        self.check_allow_list_use()
        self.cross_check_with_gcc()

    def _count(self, what, n=1):
        self.counts[what] = self.counts.get(what, 0) + n

    def check_functions(self):
        for name, c in sorted(self.shim.funcs.items(), key=lambda kv: self.shim.where(kv[1])):
            self._count("functions")
            r, unit = self.resolve("function", "funcs", name, c)
            if r is None:
                continue
            sret, sparams, svar, sproto = func_signature(c)
            rret, rparams, rvar, rproto = func_signature(r)
            if unit.lang == "c++" and not sproto:
                sproto = True   # `f()` in a C++-only real header means `f(void)`
            names = [a.spelling or "#%d" % (i + 1) for i, a in enumerate(c.get_arguments())]
            if sret != rret:
                self.rep.diff("function %s: return type: shim '%s', real '%s'" % (name, sret, rret))
            if sproto != rproto:
                self.rep.diff("function %s: shim declares it %s, real %s"
                              % (name, "with a prototype" if sproto else "without a prototype `()`",
                                 "with a prototype" if rproto else "without a prototype `()`"))
            if len(sparams) != len(rparams):
                self.rep.diff("function %s: shim has %d parameters (%s), real has %d (%s)"
                              % (name, len(sparams), ", ".join(sparams) or "void", len(rparams), ", ".join(rparams) or "void"))
            for i, (s, r_) in enumerate(zip(sparams, rparams)):
                if s != r_:
                    pname = names[i] if i < len(names) else "#%d" % (i + 1)
                    self.rep.diff("function %s: parameter %d (%s): shim '%s', real '%s'" % (name, i + 1, pname, s, r_))
            if svar != rvar:
                self.rep.diff("function %s: shim is %svariadic, real is %svariadic"
                              % (name, "" if svar else "not ", "" if rvar else "not "))
            if self.verbose:
                self.rep.ok.append("function %s: %s(%s) [%s]" % (name, sret, ", ".join(sparams), unit.label))

    def check_typedefs(self):
        for name, c in sorted(self.shim.typedefs.items(), key=lambda kv: self.shim.where(kv[1])):
            self._count("typedefs")
            r, unit = self.resolve("typedef", "typedefs", name, c)
            if r is None:
                continue
            s = canon(c.underlying_typedef_type)
            rr = canon(r.underlying_typedef_type)
            if s != rr:
                self.rep.diff("typedef %s: shim '%s', real '%s'" % (name, s, rr))
            elif self.verbose:
                self.rep.ok.append("typedef %s = %s [%s]" % (name, s, unit.label))

    def _real_record(self, c):
        """The real enum/struct/union matching shim decl c: by tag, else through a
        typedef of the same name, else (anonymous enum) by its first enumerator."""
        kw, name, tagged = decl_tag(c)
        if name is not None:
            for u in self.real_units:
                r = u.tags.get((kw, name))
                if r is not None:
                    return r, u
            r, u = self.real_lookup("typedefs", name)
            if r is not None:
                d = r.underlying_typedef_type.get_canonical().get_declaration()
                if d.kind == c.kind:
                    return record_def(d), u
        elif c.kind == CK.ENUM_DECL:
            for e in c.get_children():
                if e.kind == CK.ENUM_CONSTANT_DECL:
                    hit, u = self.real_lookup("enumerators", e.spelling)
                    if hit is not None:
                        return hit[0], u
                    break
        return None, None

    def _ref_or_missing(self, c, kind):
        kw, name, _ = decl_tag(c)
        # Opaque handle structs named only by an allow-listed typedef (aclTensor...)
        # are checked through that typedef.
        if name is not None and name in self.allow and self.allow[name].kind == "typedef":
            r = self.ref.tags.get((kw, name))
            if r is not None:
                return r, self.ref
        self.rep.diff("%s: declared by the shim (%s) but not by the real headers"
                      % (type_name_of_decl(c), self.shim.where(c)))
        return None, None

    def check_records(self):
        for c in self.shim.records:
            c = record_def(c)
            kind = RECORD_KW[c.kind]
            self._count(kind + "s")
            r, unit = self._real_record(c)
            if r is None:
                r, unit = self._ref_or_missing(c, kind)
                if r is None:
                    continue
            else:
                kw, name, tagged = decl_tag(c)
                if tagged:   # an untagged type is placed through its typedef
                    self.check_placement(kind, name, c, key="%s %s" % (kw, name))
            self._compare_tags(c, r)
            if c.kind == CK.ENUM_DECL:
                self._compare_enum(c, r, unit)
            else:
                self._compare_struct(c, r, unit)

    def _compare_tags(self, c, r):
        kw, sname, stag = decl_tag(c)
        _, rname, rtag = decl_tag(r)
        disp = type_name_of_decl(c)
        if stag and rtag and sname != rname:
            self.rep.diff("%s: tag differs: shim `%s %s`, real `%s %s`" % (disp, kw, sname, kw, rname))
        elif stag and not rtag:
            self.rep.diff("%s: shim declares the tag `%s %s`; the real type is untagged (typedef %s only)"
                          % (disp, kw, sname, rname))
        elif not stag and rtag and sname is not None:
            self.rep.diff("%s: the real type has the tag `%s %s`; the shim's is untagged (typedef only)"
                          % (disp, kw, rname))

    def _compare_enum(self, c, r, unit):
        disp = type_name_of_decl(c)
        if not r.is_definition():
            self.rep.diff("%s: the real enum has no definition" % disp)
            return
        s_it, r_it = canon(c.enum_type), canon(r.enum_type)
        if s_it != r_it:
            self.rep.diff("%s: underlying type: shim '%s', real '%s'" % (disp, s_it, r_it))
        ssize, rsize = c.type.get_size(), r.type.get_size()
        if ssize != rsize:
            self.rep.diff("%s: size: shim %d, real %d" % (disp, ssize, rsize))
        rvals = {e.spelling: e.enum_value for e in r.get_children() if e.kind == CK.ENUM_CONSTANT_DECL}
        spell_s, spell_r = self._type_spelling(c), self._type_spelling(r)
        if spell_s and spell_r:
            self._fact("sizeof(%s)" % disp, "sizeof(%s)" % spell_s, ssize, "sizeof(%s)" % spell_r, rsize, unit)
        for e in c.get_children():
            if e.kind != CK.ENUM_CONSTANT_DECL:
                continue
            self._count("enumerators")
            n, v = e.spelling, e.enum_value
            if n not in rvals:
                other, _ = self.real_lookup("enumerators", n)
                where = "" if other is None else " (the real headers put it in %s = %d)" % (type_name_of_decl(other[0]), other[1])
                self.rep.diff("%s: enumerator %s (= %d in the shim) is not in the real enum%s" % (disp, n, v, where))
                continue
            if v != rvals[n]:
                self.rep.diff("%s: %s = %d in the shim, %d in the real headers" % (disp, n, v, rvals[n]))
            self._fact("value(%s)" % n, n, v, n, rvals[n], unit)
        if self.verbose:
            self.rep.ok.append("%s: %s, size %d [%s]" % (disp, ", ".join(
                "%s=%d" % (e.spelling, e.enum_value) for e in c.get_children() if e.kind == CK.ENUM_CONSTANT_DECL),
                ssize, unit.label))

    @staticmethod
    def _type_spelling(decl):
        kw, name, tagged = decl_tag(decl)
        if name is None:
            return None
        return "%s %s" % (kw, name) if tagged else name

    def _compare_struct(self, c, r, unit):
        disp = type_name_of_decl(c)
        sdef, rdef = c.is_definition(), r.is_definition()
        if not sdef and not rdef:
            if self.verbose:
                self.rep.ok.append("%s: opaque on both sides" % disp)
            return
        if sdef and not rdef:
            self.rep.diff("%s: the shim defines its layout; the real type is opaque (incomplete)" % disp)
            return
        if rdef and not sdef:
            self.rep.diff("%s: the shim leaves it incomplete; the real headers define it (size %d)" % (disp, r.type.get_size()))
            return
        ssize, rsize = c.type.get_size(), r.type.get_size()
        salign, ralign = c.type.get_align(), r.type.get_align()
        if ssize != rsize:
            self.rep.diff("%s: size: shim %d, real %d" % (disp, ssize, rsize))
        if salign != ralign:
            self.rep.diff("%s: alignment: shim %d, real %d" % (disp, salign, ralign))
        sp_s, sp_r = self._type_spelling(c), self._type_spelling(r)
        if sp_s and sp_r:
            self._fact("sizeof(%s)" % disp, "sizeof(%s)" % sp_s, ssize, "sizeof(%s)" % sp_r, rsize, unit)
            self._fact("alignof(%s)" % disp, "__alignof__(%s)" % sp_s, salign, "__alignof__(%s)" % sp_r, ralign, unit)

        def fields(d):
            out = []
            for i, f in enumerate(x for x in d.get_children() if x.kind == CK.FIELD_DECL):
                out.append((f.spelling or "<anonymous #%d>" % i, canon(f.type), f.get_field_offsetof(),
                            f.get_bitfield_width() if f.is_bitfield() else None, i))
            return out
        sf, rf = fields(c), fields(r)
        rmap = {f[0]: f for f in rf}
        smap = {f[0]: f for f in sf}
        for name, st, soff, sbits, si in sf:
            self._count("fields")
            if name not in rmap:
                self.rep.diff("%s: field %s (%s, offset %d) is not in the real struct" % (disp, name, st, soff // 8))
                continue
            _, rt, roff, rbits, ri = rmap[name]
            if soff != roff:
                self.rep.diff("%s: field %s: offset: shim %s, real %s" % (disp, name, _bytes(soff), _bytes(roff)))
            if st != rt:
                self.rep.diff("%s: field %s: type: shim '%s', real '%s'" % (disp, name, st, rt))
            if sbits != rbits:
                self.rep.diff("%s: field %s: bit-field width: shim %s, real %s" % (disp, name, sbits, rbits))
            if si != ri and soff == roff:
                self.rep.diff("%s: field %s: position: shim #%d, real #%d" % (disp, name, si + 1, ri + 1))
            if sp_s and sp_r and sbits is None and rbits is None and not name.startswith("<"):
                self._fact("offsetof(%s, %s)" % (disp, name), "offsetof(%s, %s)" % (sp_s, name), soff // 8,
                           "offsetof(%s, %s)" % (sp_r, name), roff // 8, unit)
        for name, rt, roff, _, _ in rf:
            if name not in smap:
                self.rep.diff("%s: real field %s (%s, offset %d) is missing from the shim" % (disp, name, rt, roff // 8))
        if self.verbose:
            self.rep.ok.append("%s: size %d, align %d, fields %s [%s]" % (disp, ssize, salign, ", ".join(
                "%s %s @%s" % (st, n, _bytes(off)) for n, st, off, _, _ in sf), unit.label))

    def check_constants(self):
        consts = []
        for name, c in self.shim.macros.items():
            fl, body = macro_body(c)
            if fl or not body:
                continue   # function-like macros and include guards carry no ABI value
            consts.append((name, c, "macro", body))
        for name, c in self.shim.vars.items():
            consts.append((name, c, "variable", None))
        consts.sort(key=lambda x: self.shim.where(x[1]))
        svals = self.eval_constants(self.shim_src, PROBE_DIR + "/abi_shim_probe.c", "c", self.shim_inc, [n for n, _, _, _ in consts])
        by_unit = {}
        resolved = []
        for name, c, kind, body in consts:
            sv = svals.get(name)
            if sv is None and kind == "macro":
                self.rep.note("macro %s = %s is not an integer constant; not compared" % (name, " ".join(body)))
                continue
            self._count("constants")
            rcur, unit = self.real_lookup("macros", name)
            rkind = "macro"
            if rcur is None:
                rcur, unit = self.real_lookup("vars", name)
                rkind = "variable"
            if rcur is None:
                e = self.allow.get(name)
                if e is not None and e.kind == "constant":
                    rcur, unit, rkind = self.ref.macros.get(name), self.ref, "macro"
                if rcur is None:
                    # An enumerator with this name would be a kind mismatch, say so.
                    en, _ = self.real_lookup("enumerators", name)
                    extra = "" if en is None else " (the real headers have it as an enumerator of %s)" % type_name_of_decl(en[0])
                    self.rep.diff("constant %s: defined by the shim (%s) but not by the real headers%s, and not in %s"
                                  % (name, self.shim.where(c), extra, os.path.basename(self.allow_path)))
                    continue
            elif name in self.allow:
                e = self.allow[name]
                self.rep.diff("allow-list %s:%d: %s is defined by the public headers (%s); remove the entry"
                              % (self.allow_path, e.lineno, name, unit.where(rcur)))
            if unit is not self.ref:
                self.check_placement("constant", name, c)
            if kind != rkind:
                self.rep.diff("constant %s: the shim defines it as a %s, the real headers as a %s%s"
                              % (name, kind, rkind, " of type '%s'" % canon(rcur.type) if rkind == "variable" else ""))
            elif kind == "variable" and canon(c.type) != canon(rcur.type):
                self.rep.diff("constant %s: declared type: shim '%s', real '%s'" % (name, canon(c.type), canon(rcur.type)))
            by_unit.setdefault(id(unit), (unit, []))[1].append(name)
            resolved.append((name, unit))
        rvals = {}
        for unit, names in by_unit.values():
            vals = self.eval_constants(unit.src, unit.fname, unit.lang, unit.inc, names)
            for n in names:
                rvals[(n, id(unit))] = vals.get(n)
        for name, unit in resolved:
            sv, rv = svals.get(name), rvals.get((name, id(unit)))
            if sv is None or rv is None:
                side = "shim" if sv is None else "real"
                self.rep.diff("constant %s: the %s definition is not an integer constant" % (name, side))
                continue
            (s_val, s_ty, s_sz), (r_val, r_ty, r_sz) = sv, rv
            if s_val != r_val:
                self.rep.diff("constant %s: value: shim %d, real %d" % (name, s_val, r_val))
            if s_ty != r_ty:
                self.rep.diff("constant %s: type: shim '%s', real '%s'" % (name, s_ty, r_ty))
            self._fact("value(%s)" % name, name, s_val, name, r_val, unit)
            if self.verbose:
                self.rep.ok.append("constant %s = %d (%s) [%s]" % (name, s_val, s_ty, unit.label))
            self._fact("sizeof(%s)" % name, "sizeof(%s)" % name, s_sz, "sizeof(%s)" % name, r_sz, unit)
            s_signed = 1 if s_ty in SIGNED else 0
            r_signed = 1 if r_ty in SIGNED else 0
            self._fact("signed(%s)" % name, "((%s) - (%s) - 1 < 0)" % (name, name), s_signed,
                       "((%s) - (%s) - 1 < 0)" % (name, name), r_signed, unit)

    def eval_constants(self, src, fname, lang, inc, names):
        """name -> (value, type, size) for each name that is an integer constant
        expression in this unit; evaluated by clang as an enumerator initialiser."""
        if not src.endswith("\n"):
            src += "\n"
        base = src.count("\n") + 1   # line number of the first probe line
        lines = []
        line_of = {}
        for i, n in enumerate(names):
            line_of[base + len(lines)] = n
            lines.append("typedef __typeof__((%s)) __abi_probe_t%d;" % (n, i))
            line_of[base + len(lines)] = n
            lines.append("enum __abi_probe_e%d { __abi_probe_v%d = (%s) };" % (i, i, n))
        tu = parse(fname, src + "\n".join(lines) + "\n", lang, inc)
        bad = set()
        for d in errors_of(tu):
            f = d.location.file
            if f is not None and f.name == fname and d.location.line in line_of:
                bad.add(line_of[d.location.line])
            else:
                raise CheckerError("constant probe failed to parse: %s" % d)
        types, vals = {}, {}
        for cur in tu.cursor.get_children():
            sp = cur.spelling
            if cur.kind == CK.TYPEDEF_DECL and sp.startswith("__abi_probe_t"):
                t = cur.underlying_typedef_type
                types[int(sp[len("__abi_probe_t"):])] = (canon(t, strip_top=True), t.get_canonical().get_size())
            elif cur.kind == CK.ENUM_DECL and sp.startswith("__abi_probe_e"):
                for e in cur.get_children():
                    vals[int(e.spelling[len("__abi_probe_v"):])] = e.enum_value
        out = {}
        for i, n in enumerate(names):
            if n in bad or i not in vals or i not in types:
                continue
            ty, sz = types[i]
            if not is_integer_type(ty):
                continue
            out[n] = (vals[i], ty, sz)
        return out

    def check_allow_list_use(self):
        declared = set(self.shim.funcs) | set(self.shim.typedefs) | set(self.shim.macros) | set(self.shim.vars)
        for name, e in sorted(self.allow.items(), key=lambda kv: kv[1].lineno):
            if name not in declared:
                self.rep.diff("allow-list %s:%d: %s is not declared by the shim; remove the entry"
                              % (self.allow_path, e.lineno, name))

    # -- numbers, once more, from the compiler that builds the shim ------------

    def _fact(self, key, s_expr, s_val, r_expr, r_val, unit):
        self.facts["shim"].setdefault("shim", {})[key] = (s_expr, s_val)
        self.facts["real"].setdefault(unit.label, {})[key] = (r_expr, r_val)

    def cross_check_with_gcc(self):
        units = {u.label: u for u in self.real_units + [self.ref]}
        jobs = [("shim", "shim", self.shim_src, "c", self.shim_inc, self.facts["shim"].get("shim", {}))]
        for label, facts in self.facts["real"].items():
            u = units[label]
            jobs.append(("real", label, u.src, u.lang, u.inc, facts))
        n = 0
        for side, label, src, lang, inc, facts in jobs:
            if not facts:
                continue
            got = run_probe(src, lang, inc, facts)
            for key, (expr, clang_val) in facts.items():
                n += 1
                if got.get(key) != clang_val:
                    self.rep.error("libclang and %s disagree on %s for the %s headers (%s): libclang %s, compiler %s"
                                   % ("g++" if lang == "c++" else "gcc", key, side, label, clang_val, got.get(key)))
        self.counts["numbers cross-checked with gcc"] = n


SIGNED = {"signed char", "short", "int", "long", "long long", "__int128", "char", "wchar_t"}
UNSIGNED = {"unsigned char", "unsigned short", "unsigned int", "unsigned long", "unsigned long long",
            "unsigned __int128", "bool", "char16_t", "char32_t"}


def is_integer_type(ty):
    return ty in SIGNED or ty in UNSIGNED or ty.startswith("enum ")


def _bytes(bits):
    return "%d" % (bits // 8) if bits % 8 == 0 else "%d bits" % bits


def gcc_accepts_c(src, inc):
    cc = os.environ.get("CC", "gcc")
    cmd = [cc, "-fsyntax-only", "-x", "c", "-std=gnu11", "-w", "-"]
    for i in inc:
        cmd += ["-I", i]
    return subprocess.run(cmd, input=src, capture_output=True, text=True).returncode == 0


def run_probe(src, lang, inc, facts):
    """Compile and run a program printing every fact's expression; key -> value."""
    cc = os.environ.get("CXX", "g++") if lang == "c++" else os.environ.get("CC", "gcc")
    body = ["#include <stdio.h>", "#include <stddef.h>", src,
            "int main(void) {"]
    keys = sorted(facts)
    for i, k in enumerate(keys):
        body.append('    printf("%%d\\t%%lld\\n", %d, (long long)(%s));' % (i, facts[k][0]))
    body += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory(prefix="u3m-abi-") as d:
        srcf = os.path.join(d, "probe.cpp" if lang == "c++" else "probe.c")
        exe = os.path.join(d, "probe")
        with open(srcf, "w") as f:
            f.write("\n".join(body) + "\n")
        cmd = [cc, "-x", lang, "-std=gnu11" if lang == "c" else "-std=gnu++17", "-w", "-o", exe, srcf]
        for i in inc:
            cmd += ["-I", i]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise CheckerError("gcc probe did not compile (%s):\n%s" % (" ".join(cmd), p.stderr[-4000:]))
        p = subprocess.run([exe], capture_output=True, text=True)
        if p.returncode != 0:
            raise CheckerError("gcc probe failed to run: %s" % p.stderr)
    out = {}
    for line in p.stdout.splitlines():
        i, v = line.split("\t")
        out[keys[int(i)]] = int(v)
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--real", required=True, help="torch_npu/include of the fetched wheel")
    ap.add_argument("--shim", default=os.path.join(here, "..", "..", "shim", "include"), help="shim include root")
    ap.add_argument("--allow", default=os.path.join(here, "not-in-wheel.txt"), help="allow-list file")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list what matched")
    a = ap.parse_args(argv)
    chk = Checker(a.shim, a.real, os.path.relpath(a.allow) if not os.path.isabs(a.allow) else a.allow, a.verbose)
    try:
        chk.setup()
        chk.run()
    except CheckerError as e:
        print("ERROR %s" % e)
        sys.stderr.write("check_abi: %s\n" % e)
        return 2
    rep = chk.rep
    print("ABI check: shim %s against real %s" % (chk.shim_root, chk.real_root))
    for n in rep.notes:
        print("NOTE " + n)
    for o in rep.ok:
        print("OK   " + o)
    for d in rep.diffs:
        print("DIFF " + d)
    for e in rep.errors:
        print("ERROR " + e)
    summary = ", ".join("%d %s" % (v, k) for k, v in sorted(chk.counts.items()))
    if rep.errors:
        print("ABI check: checker errors: %d (and %d differences); compared %s" % (len(rep.errors), len(rep.diffs), summary))
        return 2
    if rep.diffs:
        print("ABI check: %d differences; compared %s" % (len(rep.diffs), summary))
        return 1
    print("ABI check: OK; compared %s" % summary)
    return 0


if __name__ == "__main__":
    try:
        rc = main(sys.argv[1:])
    except Exception:  # a crash must not look like "differences found" (exit 1)
        import traceback
        traceback.print_exc()
        print("ERROR the checker crashed (see stderr)")
        rc = 2
    sys.exit(rc)
