"""`lcm encrypt`, `lcm rekey` and `lcm decrypt`: an SQLite store encrypted at rest, a new key,
or back to plaintext (store/sqlite/convert.py does the work)."""

from __future__ import annotations

import os
from typing import Any, Callable

import click

NEW_KEY_ENV = "LCM_NEW_ENCRYPTION_KEY"


def add_commands(group: click.Group, pass_app: Callable, UserError: type) -> None:  # noqa: N803
    """Define the commands on `group` (as session_cmds.add_commands)."""

    def sqlite_location(app: Any) -> str:
        loc = app.location()
        if loc.startswith(("postgresql://", "postgres://")):
            raise UserError("the store is PostgreSQL: its data at rest is protected on the server (disk encryption "
                            "or TDE), in transit by TLS (sslmode=verify-full); see the README's Encryption at rest")
        app.check_location(loc, must_exist=True)
        return str(loc)

    def run(fn: Callable[[], Any]) -> Any:
        from ..store.sqlite.cipher import CipherError

        try:
            return fn()
        except CipherError as exc:
            raise UserError(str(exc)) from exc

    def done(verb: str, loc: str, rep: Any) -> None:
        from ..ops.retention import human_bytes

        click.echo(f"{verb} {loc}: {rep.messages:,} messages, checked (integrity, full-text indexes, every table, "
                   f"{rep.sampled_terms} sampled searches) and swapped in; {human_bytes(rep.bytes_before)} → "
                   f"{human_bytes(rep.bytes_after)}; the old file was overwritten and removed")

    @click.command()
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @pass_app
    def encrypt(app: Any, yes: bool) -> None:
        """Encrypt the SQLite store at rest (SQLCipher) with the key in LCM_ENCRYPTION_KEY or the
        configured key file: a new encrypted copy is written, checked and swapped in. Stop Hermes
        first."""
        from ..store.sqlite import cipher
        from ..store.sqlite.convert import convert

        loc = sqlite_location(app)
        if cipher.is_encrypted_file(loc):
            raise UserError(f"{loc} is already encrypted (`lcm rekey` changes its key)")
        secret = run(cipher.passphrase)
        if secret is None:
            raise UserError(f"set the key first: {cipher.KEY_ENV}, or encryption_key_file (a 0600 file) in the lcm: "
                            "config; Hermes needs the same key to open the store")
        run(cipher.driver)
        if not yes and not click.confirm(f"Encrypt {loc}? Keep the key safe: without it the history is lost"):
            raise UserError("nothing changed")
        done("encrypted", loc, run(lambda: convert(loc, None, secret)))

    @click.command()
    @click.option("--new-key-file", metavar="FILE", default=None,
                  help=f"A 0600 file holding the new key (else ${NEW_KEY_ENV}, else asked for).")
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @pass_app
    def rekey(app: Any, new_key_file: str | None, yes: bool) -> None:
        """Give the encrypted store a new key (the current one from LCM_ENCRYPTION_KEY or the key file)."""
        from ..store.sqlite import cipher
        from ..store.sqlite.convert import convert

        loc = sqlite_location(app)
        if not cipher.is_encrypted_file(loc):
            raise UserError(f"{loc} is not encrypted (`lcm encrypt` encrypts it)")
        key = run(lambda: cipher.key_for(loc))
        if new_key_file:
            new = run(lambda: cipher.read_key_file(new_key_file))
        elif os.environ.get(NEW_KEY_ENV):
            new = os.environ[NEW_KEY_ENV].encode("utf-8")
        else:
            new = click.prompt("new key", hide_input=True, confirmation_prompt=True).encode("utf-8")
        if not new:
            raise UserError("the new key is empty")
        if new == cipher.passphrase():
            raise UserError("the new key is the current one")
        if not yes and not click.confirm(f"Re-encrypt {loc} with the new key?"):
            raise UserError("nothing changed")
        done("re-encrypted", loc, run(lambda: convert(loc, key, new)))
        click.echo(f"now give Hermes the new key ({cipher.KEY_ENV} or the key file): the old one no longer opens it")

    @click.command()
    @click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
    @pass_app
    def decrypt(app: Any, yes: bool) -> None:
        """Turn the encrypted store back into a plaintext SQLite file."""
        from ..store.sqlite import cipher
        from ..store.sqlite.convert import convert

        loc = sqlite_location(app)
        if not cipher.is_encrypted_file(loc):
            raise UserError(f"{loc} is not encrypted")
        key = run(lambda: cipher.key_for(loc))
        if not yes and not click.confirm(f"Store {loc} in plaintext from now on?"):
            raise UserError("nothing changed")
        done("decrypted", loc, run(lambda: convert(loc, key, None)))
        click.echo(f"unset {cipher.KEY_ENV} / encryption_key_file, or new stores will be made encrypted")

    group.add_command(encrypt)
    group.add_command(rekey)
    group.add_command(decrypt)
