"""Encryption at rest for SQLite stores: SQLCipher through the optional ``sqlcipher3`` binding
(``pip install 'lossless-context[encryption]'``; its wheels carry their own SQLCipher, with
FTS5 and the trigram tokenizer the store's indexes need).

Which files are encrypted is read from the file itself: an SQLite file starts with the text
``SQLite format 3``, an SQLCipher file with 16 random bytes (the salt of its key). The key
is a passphrase from ``LCM_ENCRYPTION_KEY``, or the first line of a key file named by
``LCM_ENCRYPTION_KEY_FILE`` / the ``encryption_key_file`` config key (it must be private to
the user: 0600). It is never logged. A new store is made encrypted when a key is set.

The passphrase is stretched once per process and file as SQLCipher 4 itself does
(PBKDF2-HMAC-SHA512, 256,000 iterations, the file's salt), and every connection is given the
raw key: opening a connection then costs ~5 ms instead of ~150 ms of key derivation, and the
file stays readable by the ``sqlcipher`` shell with ``PRAGMA key = '<passphrase>';
PRAGMA cipher_page_size = 16384; PRAGMA cipher_hmac_algorithm = HMAC_SHA256;``. Without the key
nothing is opened or created beside the store; a wrong key is an error, never an empty store.

Every page read from the file is decrypted and its HMAC checked: with SQLCipher 4's default
HMAC-SHA512 that check cost twice the AES decryption (33 us a 16 KB page here, against 12 us for
the plaintext read and 23 us with HMAC-SHA256, which this CPU computes in hardware), most of what
an encrypted search that reads its pages from the file pays. Files are made with HMAC-SHA256;
a file made before (HMAC-SHA512) is recognised by which of the two opens it (once per process
and key) and keeps its format until `lcm rekey` or `lcm encrypt` writes a new copy.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..base import StoreError
from .wal import PAGE_SIZE

KEY_ENV = "LCM_ENCRYPTION_KEY"
KEY_FILE_ENV = "LCM_ENCRYPTION_KEY_FILE"
SQLITE_MAGIC = b"SQLite format 3\x00"
KDF_ITERATIONS = 256_000  # SQLCipher 4's default
HMAC_NEW = "HMAC_SHA256"  # the page HMAC of files made now
HMAC_OLD = "HMAC_SHA512"  # SQLCipher 4's default: files made before HMAC_NEW
HMAC_ALGORITHMS = (HMAC_NEW, HMAC_OLD)
CIPHER_PAGE_SIZE = PAGE_SIZE
INSTALL_HINT = "pip install 'lossless-context[encryption]'"

_DRIVER: Any = None
_DRIVER_LOCK = threading.Lock()
_KDF_CACHE: dict[tuple[bytes, bytes], bytes] = {}
_HMAC_FOUND: dict[tuple[bytes, bytes], str] = {}  # (raw key, salt) -> the page HMAC that opened it


class CipherError(StoreError):
    """A store that cannot be opened because of its encryption (no key, wrong key, no binding)."""


def driver() -> Any:
    """The SQLCipher DB-API module (``sqlcipher3.dbapi2``).

    Its exception classes are made subclasses of the standard ``sqlite3`` ones as well, once,
    so every ``except sqlite3.OperationalError`` of the store (a busy lock, an outage) catches
    an encrypted connection's errors the same way."""
    global _DRIVER
    if _DRIVER is None:
        with _DRIVER_LOCK:
            if _DRIVER is None:
                try:
                    from sqlcipher3 import dbapi2 as mod  # type: ignore[import-untyped,import-not-found,unused-ignore]  # an optional binding without type information; absent in many installs
                except ImportError as exc:
                    raise CipherError(f"the store is encrypted and the SQLCipher binding is not installed: "
                                      f"{INSTALL_HINT}") from exc
                for name in ("InterfaceError", "DatabaseError", "DataError", "OperationalError", "IntegrityError",
                             "InternalError", "ProgrammingError", "NotSupportedError"):
                    theirs, ours = getattr(mod, name), getattr(sqlite3, name)
                    if ours not in theirs.__mro__:
                        theirs.__bases__ = (*theirs.__bases__, ours)
                _DRIVER = mod
    return _DRIVER


_CONNECTION: Any = None


def _connection_class() -> Any:
    """The binding's connection with what the store uses of the standard module's and the
    binding lacks (``getlimit``, Python 3.11's)."""
    global _CONNECTION
    if _CONNECTION is None:
        base = driver().Connection

        class Connection(base):  # type: ignore[misc,valid-type]  # a class chosen at run time (the binding's Connection)
            def getlimit(self, category: int) -> int:
                if category == sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER:
                    return 32_766  # (SQLite's default since 3.32; the binding's build allows more)
                # (the one limit the store reads; any other is refused as the standard module
                # refuses a category it does not know)
                raise sqlite3.ProgrammingError(f"getlimit({category}): the store's SQLCipher connection answers "
                                               "only SQLITE_LIMIT_VARIABLE_NUMBER")

        _CONNECTION = Connection
    return _CONNECTION


def available() -> bool:
    try:
        driver()
    except CipherError:
        return False
    return True


def is_encrypted_file(path: str | Path) -> bool:
    """True for a non-empty file that does not start as a plain SQLite database."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return False
    return len(head) == 16 and head != SQLITE_MAGIC


def passphrase(key_file: str | None = None) -> bytes | None:
    """The configured passphrase: ``LCM_ENCRYPTION_KEY``, else the key file (``key_file``,
    ``LCM_ENCRYPTION_KEY_FILE`` or the config's ``encryption_key_file``); None when none is set."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode("utf-8")
    if key_file is None:
        from ...config import encryption_key_file

        key_file = encryption_key_file()
    if not key_file:
        return None
    return read_key_file(key_file)


def read_key_file(path: str) -> bytes:
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise CipherError(f"cannot read the encryption key file {p}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise CipherError(f"the encryption key file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise CipherError(f"the encryption key file {p} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                          f"chmod 600 {p}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CipherError(f"cannot read the encryption key file {p}: {exc.strerror or exc}") from exc
    key = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not key:
        raise CipherError(f"the encryption key file {p} is empty")
    return key


@dataclass(frozen=True)
class StoreKey:
    """The raw key of one encrypted file: derived from the passphrase and the file's salt, and
    the file's page HMAC (None for an existing file until a connection finds which opens it)."""
    raw: bytes = field(repr=False)
    salt: bytes
    hmac: str | None = None

    @classmethod
    def derive(cls, secret: bytes, salt: bytes) -> "StoreKey":
        ck = (hashlib.sha256(secret).digest(), salt)
        raw = _KDF_CACHE.get(ck)
        if raw is None:
            raw = _KDF_CACHE[ck] = hashlib.pbkdf2_hmac("sha512", secret, salt, KDF_ITERATIONS, 32)
        return cls(raw, salt)

    @classmethod
    def for_file(cls, path: str | Path, secret: bytes) -> "StoreKey":
        with open(path, "rb") as fh:
            return cls.derive(secret, fh.read(16))

    @classmethod
    def new(cls, secret: bytes) -> "StoreKey":
        """The key of a file about to be made (a new salt; HMAC_NEW)."""
        k = cls.derive(secret, os.urandom(16))
        return cls(k.raw, k.salt, HMAC_NEW)

    def algorithms(self) -> tuple[str, ...]:
        """The page HMACs to open the file with, in the order to try them: a new file's own;
        for an existing one, the one that opened it last first (the file may have been
        rewritten since, under the same key and salt), then the others."""
        if self.hmac:
            return (self.hmac,)
        known = _HMAC_FOUND.get((self.raw, self.salt))
        return HMAC_ALGORITHMS if known is None else (known, *(a for a in HMAC_ALGORITHMS if a != known))

    def pragma(self) -> str:
        """The value of ``PRAGMA key`` (raw key and salt: no derivation on the connection)."""
        return f"\"x'{self.raw.hex()}{self.salt.hex()}'\""


def key_for(path: str | Path) -> StoreKey | None:
    """The key to open ``path`` with: None for a plaintext (or new, unkeyed) store; raises
    CipherError for an encrypted file without a key or without the binding."""
    if is_encrypted_file(path):
        secret = passphrase()
        if secret is None:
            raise CipherError(f"cannot open store {path}: it is encrypted and no key is set "
                              f"({KEY_ENV}, or a key file in {KEY_FILE_ENV} / encryption_key_file)")
        _need_driver(path, "it is encrypted")
        return StoreKey.for_file(path, secret)
    try:
        empty = Path(path).stat().st_size == 0 and not Path(str(path) + "-wal").exists()
    except OSError:
        empty = True
    secret = passphrase() if empty else None  # (an existing plaintext store never looks for a key)
    if secret is not None:
        _need_driver(path, "an encryption key is set, so it is made encrypted")
        return StoreKey.new(secret)  # a new store is made encrypted when a key is set
    return None


def cache_size(key: StoreKey | None) -> int:
    """``PRAGMA cache_size`` of a store connection (KiB when negative; allocated only as used):
    16 MB, and 64 MB for an encrypted file, whose every page read from the OS cache is
    decrypted and checked again (a search re-reads the same index pages)."""
    return -65536 if key is not None else -16384


def _need_driver(path: str | Path, why: str) -> None:
    try:
        driver()
    except CipherError as exc:
        raise CipherError(f"cannot open store {path}: {why}, and the SQLCipher binding is not installed "
                          f"({INSTALL_HINT})") from exc


def connect(target: str, key: StoreKey | None, *, verify: bool = True, **kwargs: Any) -> Any:
    """An SQLite connection to ``target`` (a path, or a ``file:`` URI with ``uri=True``):
    the standard module for a plaintext store, SQLCipher with ``key`` for an encrypted one
    (checked with a first read unless ``verify`` is off: a wrong key raises CipherError)."""
    if key is None:
        return sqlite3.connect(target, **kwargs)
    algorithms = key.algorithms()
    for n, algorithm in enumerate(algorithms):
        probing = len(algorithms) > 1
        c = driver().connect(target, factory=_connection_class(), **kwargs)
        try:
            c.execute("PRAGMA cipher_log_level = NONE")  # (SQLCipher logs a wrong key's HMAC failures to stderr)
            c.execute(f"PRAGMA key = {key.pragma()}")
            c.execute(f"PRAGMA cipher_page_size = {CIPHER_PAGE_SIZE}")
            c.execute(f"PRAGMA cipher_hmac_algorithm = {algorithm}")
            if verify or probing:  # (which HMAC an existing file has is known only by a first read)
                c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            c.close()
            if "not a database" in str(exc) or "encrypted" in str(exc):
                if n + 1 < len(algorithms):
                    continue  # (the other page format)
                raise CipherError(f"cannot open store {_path_of(target)}: the encryption key does not open it "
                                  "(a wrong key, or not an lcm store)") from exc
            raise
        if probing:  # (tried first by the next connection)
            _HMAC_FOUND[(key.raw, key.salt)] = algorithm
        return c
    raise AssertionError("unreachable: at least one page HMAC is tried")


def _path_of(target: str) -> str:
    if not target.startswith("file:"):
        return target
    return unquote(urlparse(target.split("?", 1)[0]).path)


def export_to(src: Any, dest: str, key: StoreKey | None) -> None:
    """Write a copy of the open database ``src`` (a SQLCipher connection) to the new file
    ``dest``: encrypted with ``key``, or plaintext when None (``sqlcipher_export``: one read
    transaction, so a consistent copy while writers go on)."""
    value = key.pragma() if key is not None else "''"
    src.execute(f"ATTACH DATABASE ? AS lcm_copy KEY {value}", (str(dest),))
    try:
        if key is not None:
            src.execute(f"PRAGMA lcm_copy.cipher_page_size = {CIPHER_PAGE_SIZE}")
            for algorithm in HMAC_ALGORITHMS:  # (the SQL names one of the known formats, never a field's text)
                if algorithm == (key.hmac or HMAC_NEW):
                    src.execute(f"PRAGMA lcm_copy.cipher_hmac_algorithm = {algorithm}")
        else:
            src.execute(f"PRAGMA lcm_copy.page_size = {PAGE_SIZE}")
        src.execute("PRAGMA lcm_copy.auto_vacuum = INCREMENTAL")
        src.execute("SELECT sqlcipher_export('lcm_copy')").fetchall()
        version = src.execute("PRAGMA main.user_version").fetchone()[0]
        src.execute(f"PRAGMA lcm_copy.user_version = {int(version)}")
    finally:
        src.execute("DETACH DATABASE lcm_copy")

