"""Secret redaction for text on its way to a summariser, and for every summary.

`redact()` is the one entry point the engine uses.  It layers two redactors:

* our own built-in patterns (`redact_builtin`), which replace a whole secret
  with a marker such as ``[REDACTED:github_token]`` and never leave any of the
  secret's characters behind; and
* when the Hermes host is importable, its ``agent.redact.redact_sensitive_text``
  (belt and braces: it knows vendor prefixes we may not, and it evolves with
  the host).

Everything here is pure, deterministic, linear-time, and never raises.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import Callable

__all__ = ["redact", "redact_builtin", "host_available", "MARKER_PREFIX"]

MARKER_PREFIX = "[REDACTED"

# The host's prefix pass normally keeps a secret's head and tail
# (``sk-pro...7890``) and its assignment passes mangle source code
# (``MAX_TOKENS=***``).  ``file_read=True`` makes the prefix pass emit
# byte-free sentinels and skips the assignment passes, which ours cover.
_HOST_KWARGS: dict[str, bool] = {"force": True, "redact_url_credentials": True, "file_read": True}

# The host regexes cost ~0.7 us/char, and its URL-userinfo and Telegram
# patterns are quadratic on long alphanumeric runs (a 5 MB run never
# finishes).  So the host only sees lines that could interest it, with long
# runs cut out, and at most this much text per call of `redact`.
_HOST_MAX_CHARS = 500_000
_HOST_LINE_MAX = 4096


def _marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# Token-shaped secrets: recognisable by their prefix alone, anywhere in text.
# Every alternative starts with a literal so the regex engine can skip ahead
# on its first character; boundaries are checked in the callback instead of
# a leading lookbehind, which would disable that fast path (10x slower).

# (substrings that must be present, pattern, kind).  Only the families
# present in a text are compiled into its regex, so text without any
# candidate prefix is never scanned at all.
_TOKEN_FAMILIES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("sk-ant-",), r"sk-ant-[A-Za-z0-9_\-]{16,}", "anthropic_key"),
    (("sk-or-",), r"sk-or-[A-Za-z0-9_\-]{16,}", "openrouter_key"),
    (("sk-",), r"sk-[A-Za-z0-9_\-]{20,}", "openai_key"),
    (("sk_live_", "sk_test_", "rk_live_", "rk_test_"), r"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}",
     "stripe_key"),
    (("github_pat_",), r"github_pat_[A-Za-z0-9_]{20,}", "github_token"),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9]{20,}", "github_token"),
    (("glpat-",), r"glpat-[A-Za-z0-9_\-]{20,}", "gitlab_token"),
    (tuple("AKIA ASIA ABIA ACCA AGPA AIDA AIPA ANPA ANVA AROA APKA ASCA".split()),
     r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|ROA|PKA|SCA)[A-Z0-9]{16}", "aws_access_key_id"),
    (("xox",), r"xox[abposre]-[A-Za-z0-9\-]{10,}", "slack_token"),
    (("xapp-",), r"xapp-\d-[A-Za-z0-9\-]{10,}", "slack_token"),
    (("AIza",), r"AIza[0-9A-Za-z_\-]{30,}", "google_api_key"),
    (("hf_",), r"hf_[A-Za-z0-9]{30,}", "huggingface_token"),
    (("npm_",), r"npm_[A-Za-z0-9]{30,}", "npm_token"),
    (("pypi-",), r"pypi-[A-Za-z0-9_\-]{40,}", "pypi_token"),
    (("xai-",), r"xai-[A-Za-z0-9]{30,}", "xai_key"),
    (("gsk_",), r"gsk_[A-Za-z0-9]{30,}", "groq_key"),
    (("pplx-",), r"pplx-[A-Za-z0-9]{30,}", "perplexity_key"),
    (("SG.",), r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", "sendgrid_key"),
    (("dop_v1_", "doo_v1_", "dor_v1_"), r"do[opr]_v1_[a-f0-9]{64}", "digitalocean_token"),
    # A JWT, or what the host's head/tail mask leaves of one (eyJhbG...wxyz).
    (("eyJ",), r"eyJ[A-Za-z0-9_\-]{3}(?:[A-Za-z0-9_\-]{5,}(?:\.[A-Za-z0-9_\-=]{4,}){1,2}"
               r"|\.\.\.[A-Za-z0-9_\-=]{4})", "jwt"),
)
_TOKEN_KINDS = tuple((gate, kind) for gates, _, kind in _TOKEN_FAMILIES for gate in gates)


def _any_literal_re(literals: tuple[str, ...]) -> re.Pattern[str]:
    """A regex whose search finds something exactly when one of `literals` occurs in a text.

    Written as a trie (the literals grouped by their first character, then their second, …)
    rather than as a flat alternation: at each position the engine follows one branch instead
    of trying forty alternatives (x0.55 per text redacted). A literal holding another one is
    left out: wherever it occurs, the shorter one does too."""
    words = sorted(set(literals))
    words = [w for w in words if not any(o != w and o in w for o in words)]

    def branch(rests: list[str]) -> str:
        if "" in rests:  # a literal ends here (only literals that hold no other are left)
            return ""
        by_first: dict[str, list[str]] = {}
        for r in rests:
            by_first.setdefault(r[0], []).append(r[1:])
        alts = [re.escape(c) + branch(tail) for c, tail in sorted(by_first.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return re.compile(branch(words))


# Any gate of any token family: one scan tells that a text holds none (nearly every text),
# where testing each family's gates in turn costs 1.6x as much.
_TOKEN_GATES = _any_literal_re(tuple(g for g, _ in _TOKEN_KINDS))


@functools.lru_cache(maxsize=512)
def _alternation(parts: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(parts))


# (gate, family index) of the gates that hold no other gate, each with the gates that hold it.
Gates = tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]


def _flatten(families: tuple[tuple, ...]) -> Gates:
    """The gates of a family table, in table order, for `_regex_for`: (gate, family index,
    the gates holding it) for every gate that holds no other gate. A gate that holds another
    can occur only where that one does ("password" where "pass" does): it is tested only then,
    under the first gate it holds."""
    flat = [(g, i) for i, fam in enumerate(families) for g in fam[0]]
    gates = [g for g, _ in flat]

    def roots_in(g: str) -> list[str]:
        return [o for o in gates if o != g and o in g and not any(p != o and p in o for p in gates)]

    return tuple((g, i, tuple((h, k) for h, k in flat if roots_in(h)[:1] == [g]))
                 for g, i in flat if not roots_in(g))


def _regex_for(text: str, families: tuple[tuple, ...], flat: Gates) -> re.Pattern[str] | None:
    """The alternation of the families any of whose gates occurs in `text` (in table order).
    `flat`: `_flatten(families)` — one comprehension tests the gates that hold no other gate
    (a generator and an any() per family cost ~3x as much, on every text redacted); the gates
    holding one of them only where it occurs."""
    found = [(i, held) for g, i, held in flat if g in text]
    if not found:
        return None
    hit = {i for i, _ in found}
    for _, held in found:
        if held:
            hit.update(k for h, k in held if h in text)
    return _alternation(tuple(families[i][1] for i in sorted(hit)))


_TOKEN_FLAT = _flatten(_TOKEN_FAMILIES)


_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_TELEGRAM_RE = re.compile(r"\d{8,10}:AA[A-Za-z0-9_\-]{30,}")
_SLUG_RE = re.compile(r"[a-z\-]+")
_SLACK_WEBHOOK_RE = re.compile(r"(https://hooks\.slack\.com/services/)[A-Za-z0-9_/]{8,}")

# PEM blocks are found procedurally (see `_redact_pem`) so an input full of
# BEGIN lines without END lines cannot make a lazy regex go quadratic.
_PEM_BEGIN_RE = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END_RE = re.compile(r"-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# Truncated output can hold a block without its END line: swallow the header
# lines and base64 body that follow the BEGIN line.
_PEM_BODY_RE = re.compile(r"(?:\r?\n[ \t]*(?:[A-Za-z0-9+/=]{8,}|[A-Za-z\-]+:[^\n]*)[ \t]*)*")

# Context secrets: what makes them secret is the header, URL slot or key.

_AUTH_SCHEMES = frozenset("bearer basic token digest bot apikey negotiate ntlm hoba mutual".split())
# Matched from "uthorization" (literal fast path); the A/a before it is
# checked in the callback.  The header name and scheme word are kept.
_AUTH_HEADER_RE = re.compile(
    r"(?:uthorization|UTHORIZATION)[\"']?[ \t]*[:=][ \t]*[\"']?[ \t]*"
    r"(?:([A-Za-z][A-Za-z0-9_\-]{0,30})[ \t]+)?([^\s\"'<>`]{1,4096})"
)
_BEARER_RE = re.compile(r"earer[ \t]+([A-Za-z0-9._~+/\-]{16,4096}=*)(?![A-Za-z0-9._~+/\-=])")
# scheme://user:password@host — the user is kept so the reader knows which
# account was used; the password is never needed to understand a transcript.
_URL_USERINFO_RE = re.compile(r"://([^\s:@/?#\[\]\"'<>]{0,256}):([^\s@/?#\"'<>]{1,1024})@")
# scheme://TOKEN@host (a bare credential, e.g. a git remote with a PAT).
_URL_BARE_TOKEN_RE = re.compile(r"://([^\s:@/?#\"'<>]{16,1024})@")
# The host masks a whole colon-less userinfo, so our bare-token marker comes
# back as "[REDACTED:***@"; put it back together.
_MANGLED_USERINFO_RE = re.compile(r"://\[REDACTED:\*\*\*@")

# Words that can end (or, for the first five, sit anywhere in) a secret key.
# Searched in a lower-cased copy so one literal alternation covers
# PASSWORD, Password and clientSecret alike.
_KEY_ANCHORS: tuple[tuple[tuple[str, ...], str], ...] = tuple(
    ((w,), w if w in ("password", "passwd", "passphrase", "secret", "credential") else w + "(?![a-z])")
    for w in ("password", "passwd", "passphrase", "secret", "credential", "pass", "token",
              "key", "keys", "auth", "pat", "sig", "signature", "hmac", "salt", "cookie",
              "session", "sessionid", "sid")
)
_KEY_FLAT = _flatten(_KEY_ANCHORS)
_KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
_KEY_CHAR_SET = frozenset(_KEY_CHARS)
_KEY_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_DQ = r"\"((?:[^\"\\\n]|\\[^\n]){0,1024})\""
_ESC_DQ = r"\\\"([^\"\\\n]{0,1024})\\\""
_SQ = r"'([^'\n]{0,1024})'"
# key = value / key=value / key => "value" (shell, .env, code, URL params), and
# key=\"value\" inside a JSON string (a tool call's arguments).
# An unquoted value ends at "&" only where a next URL parameter ("&name=") begins: a
# password like Tr0ub4dor&3 is one value.
_ASSIGN_VALUE_RE = re.compile(
    rf"[ \t]{{0,4}}=(?![=~])>?[ \t]{{0,4}}(?:{_DQ}|{_ESC_DQ}|{_SQ}|"
    rf"((?:[^\s&\"'<>`,;)\]}}]|&(?![A-Za-z_][\w.\-]{{0,64}}=)){{1,1024}}))"
)
# "key": "value", 'key' => 'value', \"key\": \"value\" (after the key quote).
_QUOTED_VALUE_RE = re.compile(rf"[ \t]*(?::|=>?)[ \t]*(?:{_DQ}|{_ESC_DQ}|{_SQ})")
# key: value as the whole rest of its line (YAML, .properties, HTTP headers),
# so prose like "Token: expired today" passes through.
_LINE_VALUE_RE = re.compile(
    rf"[ \t]*:[ \t]+(?:{_DQ}|{_SQ}|([^\s#'\"][^\s]{{0,1023}}))(?=[ \t]*(?:#[^\n]*)?\r?$)",
    re.MULTILINE,
)
# key: "value" anywhere (JS/TS object literals, Ruby hashes).  Only quoted
# values: an unquoted one there is a type annotation ("token: string").
_INLINE_QUOTED_RE = re.compile(rf"[ \t]*:[ \t]*(?:{_DQ}|{_SQ})")
# Header values are found the way the host finds them (across a line break,
# name anywhere in the key) so whatever it masks, we normalise.
_HEADER_VALUE_RE = re.compile(r"\s*:\s*[\"']?([^\s\"'<>`]{1,4096})")
_CLI_VALUE_RE = re.compile(r"[ \t]+(?:\"([^\"\n]{1,1024})\"|'([^'\n]{1,1024})'|([^\s\-][^\s]{0,1023}))")
_LINE_LEAD_RE = re.compile(r"[ \t]*(?:-[ \t]+)?(?:export[ \t]+)?")
_HEADER_NAMES = tuple("x-api-key x-goog-api-key api-key apikey x-api-token x-auth-token "
                      "x-access-token private-token x-vault-token".split())

_CAMEL_RE = re.compile(r"([a-z0-9])([A-Z])")
_SEP_RE = re.compile(r"[.\-\s]+")
_VERSION_SEG_RE = re.compile(r"v?\d+")
_ANYWHERE_SECRET = frozenset("secret secrets credential credentials".split())
_PASSWORD_WORDS = frozenset("password passwd passphrase".split())
_KEY_QUALIFIERS = frozenset(
    "access secret signing sign encryption encrypt master session auth app license account "
    "storage service consumer deploy ssh shared root admin client subscription hmac jwt "
    "crypto cipher aes rsa webhook".split())
_ENTROPY_LAST = frozenset("key keys sig signature hmac salt cookie session sessionid sid".split())
# Keys whose value describes a secret rather than being one.
_METADATA_LAST = frozenset(
    "file path dir directory name names length len count min max type env var field label "
    "prompt hint policy required enabled enable disabled mode format expiry expires "
    "expiration ttl url uri endpoint header param arn version manager store ref provider "
    "source location size limit regex pattern rotation id ids kind scope scopes prefix".split())
# "max_tokens", "prompt_token_count", ...: token *counts*, not tokens.
_COUNT_WORDS = frozenset(
    "max min num n count total limit budget usage used per context prompt completion input "
    "output remaining reasoning".split())
_NON_VALUES = frozenset(
    "none null nil true false undefined str string bytes int integer number bool boolean "
    "float any optional secretstr char object unknown void ~ ... \u2026 yes no required "
    "redacted hidden empty | >".split())
# Possessive quantifiers: no backtracking over long identifier-like values.
_CODE_REF_RE = re.compile(
    r"[A-Za-z_$][\w$]*+(?:\.[A-Za-z_$][\w$]*+)*+\(.*"                # call
    r"|[A-Za-z_$][\w$]*+(?:\.[A-Za-z_$][\w$]*+|\[[^\]]*+\])++"       # attribute/subscript
    r"|(?:os\.getenv|os\.environ|\$ENV\{|process\.env).*",
    re.DOTALL,
)
_SECRETY_IDENT_RE = re.compile(r"[a-z_][a-z0-9_]*_[a-z0-9_]*")
_SECRET_WORD_RE = re.compile(r"pass|secret|token|key|cred|auth")
_B64ISH_RE = re.compile(r"[A-Za-z0-9+/=_\-.]+")
_HEX_RE = re.compile(r"[0-9a-fA-F]+")
_has_digit = re.compile(r"\d").search
_has_alpha = re.compile(r"[A-Za-z]").search


@functools.lru_cache(maxsize=4096)
def _classify_key(key: str) -> tuple[str, int] | None:
    """Return (kind, tier) for a secret-looking key, else None.

    Tier 1 keys are redacted whatever their value looks like; tier 2 keys only
    when the value is a high-entropy string.
    """
    norm = _SEP_RE.sub("_", _CAMEL_RE.sub(r"\1_\2", key)).lower()
    segs = [s for s in norm.split("_") if s]
    while len(segs) > 1 and _VERSION_SEG_RE.fullmatch(segs[-1]):
        segs.pop()  # SLACK_TOKEN_V2, API_KEY_2
    if not segs:
        return None
    last = segs[-1]
    prev = segs[-2] if len(segs) > 1 else ""
    if last in _METADATA_LAST or last == "tokens":
        return None
    if last == "token" and any(s in _COUNT_WORDS for s in segs[:-1]):
        return None
    if "aws" in segs and "secret" in segs:
        return ("aws_secret_key", 1)
    if last == "pass" or any(s in _PASSWORD_WORDS for s in segs):
        return ("password", 1)
    if last in ("token", "authtoken", "accesstoken", "refreshtoken", "pat"):
        return ("token", 1)
    if last == "apikey" or (last in ("key", "keys") and prev == "api"):
        return ("api_key", 1)
    if last in ("key", "keys") and prev == "private":
        return ("private_key", 1)
    if last == "clientsecret" or any(s in _ANYWHERE_SECRET for s in segs):
        if "secret" in segs or "secrets" in segs or last == "clientsecret":
            return ("secret", 1)
        return ("credential", 1)
    if last == "auth":
        return ("auth", 1)
    if last in ("key", "keys") and prev in _KEY_QUALIFIERS:
        return ("secret_key", 1)
    if last in _ENTROPY_LAST:
        return ("secret", 2)
    return None


def _high_entropy(value: str) -> bool:
    if len(value) < 16 or len(value) > 4096 or not _B64ISH_RE.fullmatch(value):
        return False
    if len(value) >= 24 and _HEX_RE.fullmatch(value):
        return True
    classes = (value != value.lower()) + (value != value.upper()) + bool(_has_digit(value))
    if classes < 2 or len(value) < 20:
        return False
    counts: dict[str, int] = {}
    for c in value:
        counts[c] = counts.get(c, 0) + 1
    n = len(value)
    return -sum(k / n * math.log2(k / n) for k in counts.values()) >= 3.5


def _is_placeholder(value: str) -> bool:
    v = value.strip()
    if not v or v.startswith(MARKER_PREFIX) or v.lower() in _NON_VALUES:
        return True
    if v.startswith(("${", "$(", "{{", "%(", "<")) or (v[0] == "{" and v[-1] == "}"):
        return True  # templates: ${DB_PASS}, {{ secrets.X }}, f"{password}"
    return v[0] == "$" and len(v) > 1 and (v[1].isalpha() or v[1] == "_")  # $GITHUB_TOKEN


def _is_code_ref(key: str, value: str) -> bool:
    low = value.lower()
    if low == key.lower() or low == key.lower().rsplit(".", 1)[-1]:
        return True  # api_key=api_key, self.token = token
    if _CODE_REF_RE.fullmatch(value):
        return True  # get_password(), config.token, os.environ["X"]
    return bool(_SECRETY_IDENT_RE.fullmatch(value) and _SECRET_WORD_RE.search(value))


def _is_masked(value: str) -> bool:
    # Another redactor's mask: "***", "«redacted:…»", or the host's head/tail
    # form "abcdef...wxyz" (13 chars).  Normalised to our marker.
    return (value.strip("*") == "" or value.startswith("\u00abredacted")
            or (len(value) == 13 and value[6:9] == "..."))


@functools.lru_cache(maxsize=8192)
def _value_verdict(key: str, value: str) -> str | None:
    """Marker to put in place of `value`, or None to keep the value."""
    cls = _classify_key(key)
    if cls is None:
        return None
    kind, tier = cls
    if _is_masked(value):
        return _marker(kind)
    if value.startswith("[REDAC"):
        return None  # ours already, possibly clipped by a summariser's budget
    if _is_placeholder(value) or _is_code_ref(key, value):
        return None
    if tier == 2 and not _high_entropy(value):
        return None
    return _marker(kind)


def _redact_keyed(text: str) -> str:
    """Redact values whose key looks secret, in every key/value syntax we know."""
    low = text.lower()
    if len(low) != len(text):  # a few non-ASCII letters change length when lowered
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
    edits: list[tuple[int, int, str]] = []
    done = 0
    n = len(text)
    anchor_re = _regex_for(low, _KEY_ANCHORS, _KEY_FLAT)
    if anchor_re is None:
        return text
    key_chars = _KEY_CHAR_SET
    for m in anchor_re.finditer(low):
        i, j = m.span()
        if i < done:
            continue
        # Most anchors start and end their key: skip the slicing then.
        ks = i
        if i and text[i - 1] in key_chars:
            back = text[max(0, i - 80):i]
            ks = i - (len(back) - len(back.rstrip(_KEY_CHARS)))
            if ks == i - 80 and ks > 0 and text[ks - 1] in key_chars:
                done = j
                continue  # an 80+ character "key" is not a key
        ke = j
        if j < n and text[j] in key_chars:
            fwd = text[j:j + 80]
            ke = j + (len(fwd) - len(fwd.lstrip(_KEY_CHARS)))
        while ke > j and text[ke - 1] in ".-":
            ke -= 1  # "...the password." ends a sentence, not a key
        while ks < i and text[ks] not in _KEY_START:
            ks += 1  # "--password", "3.token"
        done = ke
        key = text[ks:ke]
        if _classify_key(key) is None:
            continue
        prev = text[ks - 1] if ks > 0 else ""
        vm: re.Match[str] | None = None
        if prev in "\"'" and ke < n and text[ke] == prev:
            vm = _QUOTED_VALUE_RE.match(text, ke + 1)
        elif prev in "\"'" and text.startswith("\\" + prev, ke) and text[ks - 2:ks - 1] == "\\":
            vm = _QUOTED_VALUE_RE.match(text, ke + 2)
        else:
            vm = _ASSIGN_VALUE_RE.match(text, ke)
            if vm is None and ke < n and text[ke] in " \t:":
                line_start = text.rfind("\n", 0, ks) + 1
                if key.lower().endswith(_HEADER_NAMES):
                    vm = _HEADER_VALUE_RE.match(text, ke)
                elif _LINE_LEAD_RE.fullmatch(text, line_start, ks):
                    vm = _LINE_VALUE_RE.match(text, ke)
                    if vm is not None and vm.group(3) and vm.group(3).endswith((",", ";")):
                        vm = None  # TypeScript "token: string;"
                elif text[max(0, ks - 2):ks] == "--" or (prev == "-" and text[ks - 2:ks - 1] in " \t"):
                    vm = _CLI_VALUE_RE.match(text, ke)
                else:
                    vm = _INLINE_QUOTED_RE.match(text, ke)
        if vm is None:
            continue
        g = vm.lastindex  # exactly one alternative's group took part
        if not g:
            continue
        verdict = _value_verdict(key, vm.group(g))
        if verdict is not None:
            edits.append((vm.start(g), vm.end(g), verdict))
        done = max(done, vm.end())
    if not edits:
        return text
    out: list[str] = []
    pos = 0
    for s, e, new in edits:
        out.append(text[pos:s])
        out.append(new)
        pos = e
    out.append(text[pos:])
    return "".join(out)


def _before(m: re.Match[str], k: int = 1) -> str:
    s = m.start()
    return m.string[s - k] if s >= k else ""


def _sub_token(m: re.Match[str]) -> str:
    tok = m.group(0)
    if _before(m) in _TOKEN_CHARS:
        return tok  # inside a longer identifier
    if tok.startswith("A") and not tok.startswith("AIza") and m.end() < len(m.string) \
            and m.string[m.end()] in _TOKEN_CHARS:
        return tok  # an AWS-looking prefix of a longer word
    if tok.startswith("sk-") and not tok.startswith(("sk-ant-", "sk-or-")) and _SLUG_RE.fullmatch(tok[3:]):
        return tok  # "sk-some-long-branch-name" is a slug, not a key
    kind = next((k for p, k in _TOKEN_KINDS if tok.startswith(p)), "secret")
    return _marker(kind)


def _sub_telegram(m: re.Match[str]) -> str:
    return m.group(0) if _before(m).isalnum() else _marker("telegram_token")


def _sub_auth(m: re.Match[str]) -> str:
    scheme, cred = m.group(1), m.group(2)
    if _before(m) not in ("A", "a") or cred.startswith(MARKER_PREFIX):
        return m.group(0)
    if not _is_masked(cred):
        if scheme is None and (cred.lower() in _AUTH_SCHEMES or len(cred) < 6
                               or (cred.isalpha() and cred.islower() and len(cred) < 16)):
            return m.group(0)  # "Authorization: Bearer" (token elsewhere), "...: required"
        if cred.startswith(("$", "{{", "<")):
            return m.group(0)
        if (scheme is not None and scheme.lower() not in _AUTH_SCHEMES
                and len(cred) < 16 and not _has_digit(cred)):
            return m.group(0)  # prose: "Authorization: please ask"
    kind = "bearer_token" if (scheme or "").lower() == "bearer" else "authorization"
    whole, base = m.group(0), m.start()
    return whole[:m.start(2) - base] + _marker(kind) + whole[m.end(2) - base:]


def _sub_bearer(m: re.Match[str]) -> str:
    value = m.group(1)
    if _before(m) not in ("B", "b") or _before(m, 2).isalnum():
        return m.group(0)
    if not _has_digit(value):
        return m.group(0)  # prose: "Bearer authentication is required"
    whole, base = m.group(0), m.start()
    return whole[:m.start(1) - base] + _marker("bearer_token")


def _sub_userinfo(m: re.Match[str]) -> str:
    password = m.group(2)
    if password.startswith(MARKER_PREFIX):
        return m.group(0)
    if password.strip("*") and _is_placeholder(password):
        return m.group(0)  # f"postgres://{user}:{password}@{host}" templates
    return f"://{m.group(1)}:{_marker('password')}@"


def _sub_bare_token(m: re.Match[str]) -> str:
    token = m.group(1)
    if token.startswith(MARKER_PREFIX) or _is_placeholder(token):
        return m.group(0)
    if "..." not in token and not (_has_digit(token) and _has_alpha(token)):
        return m.group(0)  # a long user name, not a credential
    return f"://{_marker('url_token')}@"


def _redact_pem(text: str) -> str:
    out: list[str] = []
    pos = 0
    no_end_after = len(text) + 1  # no END line exists at or after this point
    while True:
        m = _PEM_BEGIN_RE.search(text, pos)
        if m is None:
            break
        end_m = _PEM_END_RE.search(text, m.end()) if m.end() < no_end_after else None
        if end_m is None:
            no_end_after = m.end()
            body = _PEM_BODY_RE.match(text, m.end())
            stop = body.end() if body else m.end()
        else:
            stop = end_m.end()
        out.append(text[pos:m.start()])
        out.append(_marker("private_key"))
        pos = stop
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _as_str(text: object) -> str:
    if isinstance(text, str) or text is None:
        return text or ""
    try:
        return str(text)
    except Exception:
        return ""


def _redact_builtin(text: str) -> str:
    if not text:
        return text
    # Substring gates keep the passes that cannot match from scanning at all.
    if "PRIVATE KEY" in text:
        text = _redact_pem(text)
    token_re = _regex_for(text, _TOKEN_FAMILIES, _TOKEN_FLAT) if _TOKEN_GATES.search(text) else None
    if token_re is not None:
        text = token_re.sub(_sub_token, text)
    if ":AA" in text:
        text = _TELEGRAM_RE.sub(_sub_telegram, text)
    if "hooks.slack.com" in text:
        text = _SLACK_WEBHOOK_RE.sub(lambda m: m.group(1) + _marker("slack_webhook"), text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER_RE.sub(_sub_auth, text)
    if "earer" in text:
        text = _BEARER_RE.sub(_sub_bearer, text)
    if "://" in text and "@" in text:
        text = _URL_USERINFO_RE.sub(_sub_userinfo, text)
        text = _URL_BARE_TOKEN_RE.sub(_sub_bare_token, text)
        if "[REDACTED:***@" in text:
            text = _MANGLED_USERINFO_RE.sub("://" + _marker("url_token") + "@", text)
    if "=" in text or ":" in text or "-" in text:
        text = _redact_keyed(text)
    if "aws" in text.lower():
        text = _redact_aws_secret_prose(text)
    return text


# An AWS secret access key (40 base64 characters) named in prose rather than by its
# variable name ("the aws_secret credential: wJalr…"): "aws" shortly before, and the
# shape of the key itself (mixed case and digits, nothing longer around it).
_AWS_SECRET_RE = re.compile(r"(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])")
_AWS_WORD_RE = re.compile(r"aws", re.IGNORECASE)


def _redact_aws_secret_prose(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        v = m.group(1)
        if not (any(c.islower() for c in v) and any(c.isupper() for c in v) and any(c.isdigit() for c in v)):
            return v
        if not _AWS_WORD_RE.search(text, max(0, m.start() - 80), m.start()):
            return v
        return _marker("aws_secret_key")

    return _AWS_SECRET_RE.sub(sub, text)


def redact_builtin(text: str) -> str:
    """Redact secrets using only this module's own patterns.

    Each secret is replaced by ``[REDACTED:<kind>]``; the text around it is
    kept byte for byte.  Idempotent, linear-time, never raises.
    """
    try:
        return _redact_builtin(_as_str(text))
    except Exception:  # pragma: no cover - fail closed: never leak on a bug
        return _marker("unprocessable")


# The Hermes host redactor, when installed.

@functools.lru_cache(maxsize=1)
def _host_redactor() -> Callable[[str], str] | None:
    """Import the host redactor once; None if it is absent or unusable."""
    from ..hostapi import secret_redactor

    redact_sensitive_text = secret_redactor()
    if redact_sensitive_text is None:
        return None
    try:
        params = inspect.signature(redact_sensitive_text).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        kwargs = {k: v for k, v in _HOST_KWARGS.items() if takes_any or k in params}
    except (TypeError, ValueError):
        kwargs = dict(_HOST_KWARGS)

    def call(text: str) -> str:
        try:
            out = redact_sensitive_text(text, **kwargs)
        except TypeError:
            out = redact_sensitive_text(text)  # an older, keyword-less signature
        return out if isinstance(out, str) else text

    return call


def host_available() -> bool:
    """True when the Hermes host redactor is importable in this process."""
    return _host_redactor() is not None


# Anything one of the host's passes could act on; lines without a trigger
# are never shown to the host.  (gates, pattern) as for _TOKEN_FAMILIES.
_HOST_TRIGGERS: tuple[tuple[tuple[str, ...], str], ...] = tuple(
    ((lit,), re.escape(lit)) for lit in (
        "sk- sk_ rk_ ghp_ gho_ ghu_ ghs_ ghr_ github_pat_ xox xapp- AIza AKIA pplx- fal_ fc- "
        "bb_live_ gAAAA SG. hf_ r8_ npm_ pypi- dop_v1_ doo_v1_ am_ tvly- exa_ gsk_ syt_ "
        "retaindb_ hsk- mem0_ brv_ xai- ntn_ fw- fw_ fpk_ eyJ uthorization UTHORIZATION "
        "pi-key pi-Key PI-KEY pikey piKey PIKEY -token -Token -TOKEN").split()
) + (
    (("//",), r"//[^\s/?#@]{1,512}@"),
    (("?",), r"\?[A-Za-z0-9_.~+%\-]{1,64}="),
    (("#",), r"#[A-Za-z0-9_.~+%\-]{1,64}="),
    (("&",), r"&[A-Za-z0-9_.~+%\-]{1,64}="),
    ((";",), r";[A-Za-z0-9_.~+%\-]{1,64}="),
    (("+",), r"\+[1-9]\d{6}"),
    ((":",), r":[A-Za-z0-9_\-]{30}"),
)
_HOST_FLAT = _flatten(_HOST_TRIGGERS)
# Runs the host's userinfo and Telegram regexes backtrack over quadratically.
_LONG_RUN_RE = re.compile(r"[A-Za-z0-9+.\-_]{64,}")


def _host_units(text: str) -> list[tuple[int, int]]:
    """Disjoint spans worth showing the host: the lines holding a trigger.

    A line longer than _HOST_LINE_MAX contributes a window (cut at spaces).
    Collection stops after _HOST_MAX_CHARS: a deterministic cap, the rest of
    a huge text keeps the builtin result only.
    """
    units: list[tuple[int, int]] = []
    trigger_re = _regex_for(text, _HOST_TRIGGERS, _HOST_FLAT)
    pos, budget, n = 0, _HOST_MAX_CHARS, len(text)
    while trigger_re is not None and budget > 0:
        m = trigger_re.search(text, pos)  # resumes after the unit: one search per line
        if m is None:
            break
        # Bounded searches: unbounded ones per trigger would be quadratic
        # on a single 5 MB line.
        lo = max(pos, m.start() - _HOST_LINE_MAX)
        nl = text.rfind("\n", lo, m.start())
        if nl >= 0 or lo == pos:
            ls = nl + 1 if nl >= 0 else lo
        else:
            sp = text.find(" ", max(pos, m.start() - 256), m.start())
            ls = sp + 1 if sp >= 0 else m.start()
        limit = min(n, max(ls + _HOST_LINE_MAX, m.end()))
        nl = text.find("\n", m.end(), limit)
        if nl >= 0 or limit == n:
            le = nl if nl >= 0 else n
        else:
            sp = text.rfind(" ", m.end(), limit)
            le = sp if sp >= 0 else limit
        units.append((ls, le))
        budget -= le - ls
        pos = max(le, m.end())
    return units


# Joins pieces for one call.  The host's \s* / \s+ can cross a bare newline
# ("Authorization: required\n<next piece>"); no pattern can cross this
# without consuming the U+E000 (private use: neither \s nor \w), which
# changes the split count and sends us to the per-piece fallback.
_PIECE_SEP = "\n\ue000\n"


def _map_lines(fn: Callable[[str], str], pieces: list[str]) -> list[str]:
    """Run `fn` over the pieces in one call; per piece if they interact."""
    if not pieces:
        return []
    try:
        out = fn(_PIECE_SEP.join(pieces)).split(_PIECE_SEP)
        if len(out) == len(pieces):
            return out
    except Exception:
        pass
    result = []
    for piece in pieces:
        try:
            result.append(fn(piece))
        except Exception:
            result.append(piece)
    return result


def _host_round(host: Callable[[str], str], units: list[str]) -> list[str]:
    """The host over each unit (long runs cut out), then our patterns again
    over what it touched so its "***" and head/tail masks become our markers."""
    spans: list[tuple[int, int, int]] = []
    for u, unit in enumerate(units):
        pos = 0
        for r in _LONG_RUN_RE.finditer(unit):
            if r.start() > pos:
                spans.append((u, pos, r.start()))
            pos = r.end()
        if pos < len(unit):
            spans.append((u, pos, len(unit)))
    pieces = [units[u][s:e] for u, s, e in spans]
    got = _map_lines(host, pieces)
    parts: dict[int, list[str]] = {}
    cursor = [0] * len(units)
    touched: list[int] = []
    for (u, s, e), old, new in zip(spans, pieces, got):
        parts.setdefault(u, []).extend((units[u][cursor[u]:s], new))
        cursor[u] = e
        if new != old and (not touched or touched[-1] != u):
            touched.append(u)
    out = list(units)
    again = _map_lines(_redact_builtin, ["".join(parts[u]) + units[u][cursor[u]:] for u in touched])
    for u, unit in zip(touched, again):
        out[u] = unit
    return out


def _apply_host(host: Callable[[str], str], text: str) -> str:
    spans = _host_units(text)
    current = [text[s:e] for s, e in spans]
    todo = list(range(len(spans)))
    # The host is not idempotent on its own output ("abcdef...wxyz" becomes
    # "***" next time), so settle each unit to a fixed point: that is what
    # makes redact(redact(x)) == redact(x).  Masks converge in two rounds.
    for _ in range(4):
        if not todo:
            break
        result = _host_round(host, [current[u] for u in todo])
        todo_next = []
        for u, new in zip(todo, result):
            if new != current[u]:
                current[u] = new
                todo_next.append(u)
        todo = todo_next
    out: list[str] = []
    pos = 0
    for (s, e), unit in zip(spans, current):
        out += [text[pos:s], unit]
        pos = e
    out.append(text[pos:])
    return "".join(out)


def redact(text: str) -> str:
    """Redact secrets from `text` before it reaches a summariser or a summary.

    Runs our own patterns, then the Hermes host redactor when it is
    importable (``force=True, redact_url_credentials=True``, byte-free
    sentinels) over the lines it could act on, then our patterns again over
    whatever the host touched, until each such line is stable.  Idempotent;
    never raises; text without secrets comes back unchanged.
    """
    text = _as_str(text)
    try:
        out = _redact_builtin(text)
    except Exception:  # pragma: no cover - fail closed: never leak on a bug
        return _marker("unprocessable")
    try:
        host = _host_redactor()
        if host is not None and out:
            out = _apply_host(host, out)
    except Exception:  # pragma: no cover - the host must never break us
        pass
    return out
