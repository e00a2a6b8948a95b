"""Task images built on this machine with no container registry.

Contract:
- `base_image(log)`: the tag of a Debian bookworm image (debootstrap `--variant=minbase` with
  python3, git, ca-certificates and bash, from the Debian mirror apt is configured with, then
  `docker import`ed with a CMD, a PATH and the label `vf-nemogym.image=base`). Built once per
  docker daemon and reused while `docker image inspect` finds it; concurrent callers (threads or
  processes) build it once, under a file lock; the root filesystem lives in a temporary folder
  removed afterwards, whatever happens.
- `task_image(tag, repo, opencode=..., log=...)`: `docker build` (the legacy builder, which works
  offline) `FROM` the base: `/usr/bin/python` -> python3, the host's CA bundle, OpenCode's
  executable when asked (from the npm package `opencode-ai@<version>`, installed once per version
  into the package cache; its optional dependency `opencode-linux-<arch>` holds the executable),
  OpenCode's no-fetch/no-update/no-share switches, a writable `$HOME`, optional setup commands,
  and the repository at `/app` (or another `workdir`) as one git commit with a fixed author,
  committer and dates, so the same files give the same `base_commit` on every build. The commit
  is written to `/base_commit` in the image and read back by `image_base_commit(tag)`. Returns
  `tag`.
- Errors are one line: `StackError` for what the machine lacks or a command that failed (no
  docker CLI or daemon, no debootstrap, not root, a failed debootstrap/build/npm install),
  `ConfigError` for bad input (a repository path outside the repository, no apt mirror found).
Nothing here prints; progress goes to `log`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from verifiers_nemogym.containers.docker import daemon, docker_cli, missing_images
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.util import file_lock, last_line, private_cache, run_checked

logger = logging.getLogger(__name__)

BASE_TAG = "vf-nemogym/debian-base:bookworm"
"""Tag of the base image `base_image` builds (local to the docker daemon, never pushed)."""
LABEL = "vf-nemogym.image"
"""Image label naming what built it: `base` or `task`."""
SUITE = "bookworm"
PACKAGES = ("python3", "git", "ca-certificates", "bash")
"""What debootstrap adds to the minbase variant."""
DEFAULT_OPENCODE = "1.17.11"
"""OpenCode version baked into task images by default (NeMo Gym 0.7.0's swebench_pro pairing)."""
OPENCODE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "true",  # else it fetches a model list from the web at start
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
"""The host's CA bundle, copied into task images (an egress proxy may sign TLS with its own CA)."""
COMMIT_DATE = "2024-01-01T00:00:00+00:00"
COMMIT_NAME = "vf-nemogym"
COMMIT_EMAIL = "tasks@vf-nemogym.invalid"
BASE_COMMIT_FILE = "/base_commit"
DEFAULT_WORKDIR = "/app"
PATH_VALUE = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DEBOOTSTRAP_TIMEOUT = 1800.0
BUILD_TIMEOUT = 900.0
_TAG = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")


# ----------------------------------------------------------------------------------- docker


def docker() -> str:
    """The docker CLI's path, after checking its daemon answers (`containers.docker`);
    StackError (one line) if not."""
    cli = docker_cli()
    daemon()
    return cli


def image_exists(tag: str) -> bool:
    """Whether the local docker daemon has an image `tag`."""
    return not missing_images([tag])


def _check_tag(tag: str) -> None:
    if not _TAG.match(tag):
        raise ConfigError(f"{tag!r} is not a docker image tag (lower-case name[:tag])")


# ----------------------------------------------------------------------------------- mirror


def apt_mirror(
    sources_dir: Path = Path("/etc/apt/sources.list.d"),
    sources_list: Path = Path("/etc/apt/sources.list"),
) -> str:
    """The Debian archive apt is configured with: the first `URIs:` of a deb822 `*.sources`
    stanza of type `deb` listing a release suite (a suite name without `-`, i.e. not
    `-security`/`-updates`), else the URI of such a `deb` line of `sources.list`. Comment lines
    (e.g. `# http://snapshot...`) are ignored. ConfigError if none is found."""
    for path in sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []:
        for stanza in _stanzas(_read(path)):
            types = stanza.get("types", "").split()
            suites = stanza.get("suites", "").split()
            uris = stanza.get("uris", "").split()
            enabled = stanza.get("enabled", "yes").lower() != "no"
            if enabled and "deb" in types and uris and any("-" not in s for s in suites):
                return uris[0].rstrip("/")
    for line in _read(sources_list).splitlines():
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and "-" not in words[2]:
            return words[1].rstrip("/")
    raise ConfigError(
        f"no Debian archive found in apt's configuration ({sources_dir}/*.sources `URIs:` or "
        f"{sources_list} `deb` lines); pass the mirror URL explicitly"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _stanzas(text: str) -> list[dict[str, str]]:
    """deb822 stanzas as {lower-cased field: value}, comments dropped, continuations joined."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0].isspace() and last:
            current[last] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            last = key.strip().lower()
            current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


# ------------------------------------------------------------------------------------- base


def _debootstrap() -> str:
    found = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)),
        None,
    )
    if found is None:
        raise StackError("no `debootstrap` found (Debian: apt-get install debootstrap)")
    return found


def base_image(
    log: logging.Logger = logger, *, tag: str = BASE_TAG, mirror: str | None = None
) -> str:
    """The tag of the Debian base image (module contract), built now if the daemon lacks it.
    `mirror`: the Debian archive URL (default: `apt_mirror()`). Building needs root (debootstrap)
    and takes minutes; reusing takes one `docker image inspect`."""
    _check_tag(tag)
    cli = docker()
    if image_exists(tag):
        return tag
    debootstrap = _debootstrap()
    if os.geteuid() != 0:
        raise StackError("building the base image needs root (debootstrap chroots); run as root")
    root = private_cache("images")
    with file_lock(root / ".base.lock"):
        if image_exists(tag):
            return tag
        url = mirror or apt_mirror()
        began = time.monotonic()
        log.info("building the base image %s: debootstrap %s from %s (minutes)", tag, SUITE, url)
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=root) as scratch:
            rootfs = Path(scratch) / "rootfs"
            run_checked(
                [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                 str(rootfs), url],
                f"debootstrap {SUITE} from {url}", DEBOOTSTRAP_TIMEOUT,
            )  # fmt: skip
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (rootfs / cache).glob("*"):
                    if item.is_file() and item.name != "lock":
                        item.unlink()
            log.info("debootstrap done in %.0f s; importing into docker", time.monotonic() - began)
            _import(cli, rootfs, tag)
        log.info("built the base image %s in %.0f s", tag, time.monotonic() - began)
    return tag


def _import(cli: str, rootfs: Path, tag: str) -> None:
    """`tar -C rootfs -c . | docker import` with a CMD, PATH and the base label."""
    changes = ['CMD ["/bin/bash"]', f"ENV PATH={PATH_VALUE}", f"LABEL {LABEL}=base"]
    args = [cli, "import"]
    for change in changes:
        args += ["--change", change]
    args += ["-", tag]
    with subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    ) as tar:  # fmt: skip
        try:
            out = subprocess.run(
                args, stdin=tar.stdout, capture_output=True, text=True, timeout=BUILD_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            tar.kill()
            raise StackError(f"`docker import {tag}` took over {BUILD_TIMEOUT:.0f} s") from None
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        tar_rc = tar.wait(timeout=60)
    if tar_rc != 0:
        raise StackError(f"tar of the base root filesystem failed: {last_line(tar_err)}")
    if out.returncode != 0:
        raise StackError(f"`docker import {tag}` failed: {last_line(out.stderr)}")


# ------------------------------------------------------------------------------------- task


def opencode_binary(version: str = DEFAULT_OPENCODE, log: logging.Logger = logger) -> Path:
    """OpenCode's Linux executable of `version` for this machine's architecture: npm package
    `opencode-ai@<version>` installed once per version into the package cache (the same
    install the coding-agent harnesses use), its `opencode-linux-<arch>` dependency's
    `bin/opencode`. StackError if npm fails or the package holds no such executable."""
    from verifiers_nemogym.nemo import agent_clis

    cli = agent_clis.CLIS["opencode_agent"]
    deadline = time.monotonic() + agent_clis.INSTALL_TIMEOUT
    folder = agent_clis._installed(cli, version, deadline, log)
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    modules = folder / "node_modules"
    # The plain build first; `-baseline` (no AVX2) and `-musl` builds are fallbacks.
    for name in (f"opencode-linux-{arch}", f"opencode-linux-{arch}-baseline"):
        binary = modules / name / "bin" / "opencode"
        if binary.is_file():
            return binary
    found = sorted(modules.glob(f"opencode-linux-{arch}*/bin/opencode"))
    if found:
        return found[0]
    raise StackError(
        f"opencode-ai@{version} installed no opencode-linux-{arch} executable under {modules}"
    )


def _repo_files(repo: Mapping[str, str] | Path) -> dict[str, bytes | Path]:
    """Relative POSIX path -> content (text) or source file, checked to stay inside the repo."""
    files: dict[str, bytes | Path] = {}
    if isinstance(repo, Path):
        if not repo.is_dir():
            raise ConfigError(f"{repo}: not a folder")
        for path in sorted(repo.rglob("*")):
            if path.is_file() and ".git" not in path.relative_to(repo).parts:
                files[path.relative_to(repo).as_posix()] = path
    else:
        for name, text in repo.items():
            files[name] = text.encode()
    if not files:
        raise ConfigError("a task repository needs at least one file")
    for name in files:
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts or not pure.parts:
            raise ConfigError(f"repository path {name!r} is not a relative path inside the repo")
    return files


def dockerfile(
    base: str,
    *,
    opencode: bool,
    ca_bundle: bool,
    workdir: str = DEFAULT_WORKDIR,
    setup: Sequence[str] = (),
) -> str:
    """The task image's Dockerfile (module contract); the build context holds `repo/`, and
    `ca-certificates.crt` / `opencode` when those are asked for. `setup`: shell commands run as
    root (one `RUN` each) after the CA bundle is in place and before the repository is copied
    to `workdir`."""
    env = " ".join(f"{k}={v}" for k, v in OPENCODE_ENV.items())
    git_env = (
        f"GIT_AUTHOR_NAME={COMMIT_NAME} GIT_AUTHOR_EMAIL={COMMIT_EMAIL} "
        f"GIT_COMMITTER_NAME={COMMIT_NAME} GIT_COMMITTER_EMAIL={COMMIT_EMAIL} "
        f"GIT_AUTHOR_DATE={COMMIT_DATE} GIT_COMMITTER_DATE={COMMIT_DATE}"
    )
    lines = [
        f"FROM {base}",
        f"LABEL {LABEL}=task",
        "RUN ln -sf python3 /usr/bin/python",
    ]
    if ca_bundle:
        lines.append("COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt")
    if opencode:
        lines.append("COPY opencode /usr/local/bin/opencode")
    lines += [
        f"ENV {env} HOME=/root",
        "RUN mkdir -p /root/.config /root/.local/share /root/.cache && chmod 0755 /root",
        *(f"RUN {command}" for command in setup),
        f"COPY repo {workdir}",
        f"WORKDIR {workdir}",
        # safe.directory: the agent or verifier may run git as another uid on the repository.
        "RUN git config --system --add safe.directory '*' "
        f"&& git config --system user.name {COMMIT_NAME} "
        f"&& git config --system user.email {COMMIT_EMAIL} "
        "&& git init -q -b main && git add -A "
        f"&& {git_env} git commit -q -m base "
        f"&& git rev-parse HEAD > {BASE_COMMIT_FILE}",
    ]
    if opencode:
        lines.append("RUN opencode --version")
    return "\n".join(lines) + "\n"


def task_image(
    tag: str,
    repo: Mapping[str, str] | Path,
    *,
    opencode: str | None = DEFAULT_OPENCODE,
    base: str | None = None,
    workdir: str = DEFAULT_WORKDIR,
    setup: Sequence[str] = (),
    log: logging.Logger = logger,
) -> str:
    """Build the task image `tag` (module contract) and return `tag`. `repo`: the repository's
    files as {relative path: text}, or a folder (copied without any `.git`); `opencode`: the
    OpenCode version to bake in, or None for none; `base`: the image to build FROM (default:
    `base_image(log)`, built first if missing); `workdir`: where the repository goes (absolute;
    also the image's WORKDIR); `setup`: shell commands run as root before the repository is
    copied (e.g. an `apt-get install` from the base's Debian mirror, which needs the network at
    build time). Rebuilding with the same inputs reuses docker's
    layer cache and gives the same `base_commit`."""
    _check_tag(tag)
    if not workdir.startswith("/") or not re.fullmatch(r"[A-Za-z0-9/._-]+", workdir):
        raise ConfigError(f"task image workdir {workdir!r} is not an absolute plain path")
    files = _repo_files(repo)
    base = base or base_image(log)
    cli = docker()
    binary = opencode_binary(opencode, log) if opencode else None
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="context-", dir=private_cache("images")) as scratch:
        context = Path(scratch)
        for name, content in files.items():
            target = context / "repo" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copy2(content, target)
            else:
                target.write_bytes(content)
                target.chmod(0o755 if name.endswith(".sh") else 0o644)
        ca_bundle = HOST_CA_BUNDLE.is_file()
        if ca_bundle:
            shutil.copyfile(HOST_CA_BUNDLE, context / "ca-certificates.crt")
        else:
            log.warning("no host CA bundle at %s; the image keeps Debian's", HOST_CA_BUNDLE)
        if binary is not None:
            _link_or_copy(binary, context / "opencode")
        (context / "Dockerfile").write_text(
            dockerfile(
                base, opencode=binary is not None, ca_bundle=ca_bundle, workdir=workdir, setup=setup
            )
        )
        log.info("building task image %s%s", tag, f" (OpenCode {opencode})" if binary else "")
        run_checked(
            [cli, "build", "-q", "-t", tag, str(context)],
            f"`docker build -t {tag}`", BUILD_TIMEOUT,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )  # fmt: skip
    log.info("built task image %s in %.1f s", tag, time.monotonic() - began)
    return tag


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    os.chmod(target, 0o755)


def image_base_commit(tag: str) -> str:
    """The `base_commit` recorded in task image `tag` (its `/base_commit`), read by running the
    image once without a network. StackError if the image has none."""
    out = run_checked(
        [docker(), "run", "--rm", "--network", "none", "--entrypoint", "cat", tag,
         BASE_COMMIT_FILE],
        f"reading {BASE_COMMIT_FILE} of {tag}", 120,
    )  # fmt: skip
    commit = out.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise StackError(f"{tag}: {BASE_COMMIT_FILE} holds no commit id ({commit[:60]!r})")
    return commit


# ------------------------------------------------------------------------------------ execd

EXECD_REPOSITORY = "vf-nemogym/opensandbox-execd"
"""Repository of the stand-in execd images `execd_image` builds (tag: a hash of their files)."""
EXECD_BOOTSTRAP = (
    "#!/bin/sh\n"
    "# The stand-in execd's bootstrap (docs/containers.md): execd in the background, then the\n"
    "# sandbox's own command (or a wait when it has none).\n"
    "/opt/opensandbox/execd >/tmp/opensandbox-execd.log 2>&1 &\n"
    'if [ "$#" -eq 0 ]; then wait; else exec "$@"; fi\n'
)


def execd_image(log: logging.Logger = logger, *, base: str | None = None) -> str:
    """The tag of an "execd image" for OpenSandbox's server (`[runtime] execd_image`): `base`
    (default `base_image(log)`, whose `python3` the stand-in needs) plus `/execd` (the package's
    stand-in, `containers.opensandbox_execd`) and `/bootstrap.sh`, labelled `LABEL=execd`. Its
    tag is a hash of both files, so a changed stand-in is a new image (the server reads the
    image once per start); reused while the daemon has it."""
    from hashlib import sha256

    from verifiers_nemogym.containers import opensandbox_execd

    execd = Path(opensandbox_execd.__file__).read_bytes()
    digest = sha256(execd + b"\0" + EXECD_BOOTSTRAP.encode()).hexdigest()[:12]
    tag = f"{EXECD_REPOSITORY}:{digest}"
    if image_exists(tag):
        return tag
    base = base or base_image(log)
    cli = docker()
    with tempfile.TemporaryDirectory(prefix="execd-", dir=private_cache("images")) as scratch:
        folder = Path(scratch)
        (folder / "execd").write_bytes(execd)
        (folder / "bootstrap.sh").write_text(EXECD_BOOTSTRAP)
        for name in ("execd", "bootstrap.sh"):
            (folder / name).chmod(0o755)
        what = f"building the execd image {tag}"
        container = run_checked(
            [cli, "create", "--label", f"{LABEL}=execd", base, "tail", "-f", "/dev/null"],
            what, BUILD_TIMEOUT,
        ).strip()  # fmt: skip
        try:
            for name in ("execd", "bootstrap.sh"):
                run_checked([cli, "cp", str(folder / name), f"{container}:/{name}"], what, 120)
            run_checked(
                [cli, "commit", "-c", f"LABEL {LABEL}=execd", container, tag], what, BUILD_TIMEOUT
            )
        finally:
            run_checked([cli, "rm", "-f", container], what, 120)
    log.info("built the execd image %s (the stand-in execd)", tag)
    return tag
