"""Paths users give on the command line: URLs, and outputs that must never overwrite inputs.

`refuse_overwrite` is the one check every command runs before it writes anything: an output
that is an input (the same path, a path that resolves to it through symlinks or `..`, a hard
link to it), or that lies inside an input folder, or that is another output of the same
command, is refused as bad input (exit 2) and nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from trainguard.errors import BadInputError

PathArg = str | os.PathLike[str] | None


def is_url(value: object) -> bool:
    """True for `s3://...`, `gs://...` and other fsspec URLs (`file://` included)."""
    return "://" in str(value)


def is_remote(root: object) -> bool:
    """True for an object-store URL (`s3://`, `gs://`, ...); `file://` URLs and plain paths are
    local. The one test of whether a checkpoint root or an output lives on a remote store."""
    text = str(root)
    return "://" in text and not text.startswith("file://")


def local_path(root: str | os.PathLike[str]) -> Path:
    """A local root (a path or a `file://` URL) as a Path, `~` expanded."""
    return Path(str(root).removeprefix("file://")).expanduser()


def _local(value: PathArg) -> Path | None:
    if value is None or is_url(value) or str(value) in ("", "stdlib"):
        return None
    return Path(value).expanduser()


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False  # one of them does not exist yet


def _inside(path: Path, folder: Path) -> bool:
    if not folder.is_dir():
        return False
    return path.resolve().is_relative_to(folder.resolve())


def refuse_overwrite(
    outputs: Mapping[str, PathArg],
    inputs: Mapping[str, PathArg],
    *,
    replaced_folders: Iterable[str] = (),
) -> None:
    """Raise BadInputError if an output would overwrite an input or another output.

    `outputs` and `inputs` map how the user named each path (`--clusters`, `SOURCE`) to it;
    None, URLs and `stdlib` are skipped. An output is refused when it is an input, when it is
    inside an input folder, or when two outputs are the same file. Outputs named in
    `replaced_folders` are folders the command empties and rewrites (Spark's overwrite mode):
    for them an input inside the folder is refused too.
    """
    outs = {k: p for k, v in outputs.items() if (p := _local(v)) is not None}
    ins = {k: p for k, v in inputs.items() if (p := _local(v)) is not None}
    replaced = set(replaced_folders)
    for out_name, out in outs.items():
        for in_name, inp in ins.items():
            if _same(out, inp):
                problem = f"{out_name} {out} is the input {in_name} {inp}"
            elif _inside(out, inp):
                problem = f"{out_name} {out} is inside the input folder {in_name} {inp}"
            elif out_name in replaced and _inside(inp, out):
                problem = (
                    f"{out_name} {out} is a folder the command replaces, and it holds the "
                    f"input {in_name} {inp}"
                )
            else:
                continue
            raise BadInputError(
                f"{problem}: writing there would overwrite the input; nothing was written",
                f"give {out_name} a path outside the input",
            )
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _same(outs[a], outs[b]):
                raise BadInputError(
                    f"{a} and {b} are the same file {outs[a]}: one output would overwrite the "
                    "other; nothing was written",
                    f"give {a} and {b} different paths",
                )


# Exceptions object-store clients raise when no usable credentials are found (botocore for
# s3://, google-auth for gs://), matched by name so that no client library is imported here.
_CREDENTIAL_ERRORS = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "DefaultCredentialsError",
}


def credentials_error(exc: BaseException, url: str) -> BadInputError | None:
    """A BadInputError for `url` when `exc` says the store has no credentials, else None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # fsspec wraps the client's error
        seen.add(id(cause))
        if any(t.__name__ in _CREDENTIAL_ERRORS for t in type(cause).__mro__):
            scheme = url.split("://", 1)[0]
            how = (
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or give "
                "the key and secret in the storage options"
                if scheme in ("s3", "s3a")
                else f"configure credentials for {scheme}:// (see the fsspec backend's docs)"
            )
            return BadInputError(f"no credentials to access {url}: {cause}", how)
        cause = cause.__cause__ or cause.__context__
    return None
