"""Where a built image is pushed: the registry and repository, and how to log in to it.

Any registry works through the user's own `docker login`. An ECR registry
(`<account>.dkr.ecr.<region>.amazonaws.com`) is logged in to by the launcher itself: boto3's
`get_authorization_token` (the credentials of the environment, as for `--cluster aws`), handed
to `docker login --password-stdin` under a temporary DOCKER_CONFIG that is deleted after the
push, so the 12-hour token is never written to the user's docker configuration. boto3 is
imported only when an ECR host is named.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput, InfraError
from launcher.inputs.recipe import Image

if TYPE_CHECKING:
    from boto3.session import Session
    from types_boto3_ecr import ECRClient

ECR_HOST = re.compile(
    r"(?P<account>[0-9]{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-[0-9])"
    r"\.amazonaws\.com(?:\.cn)?"
)
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Target:
    """One push: `<registry>/<path>/<name>:<tag>`; ECR's account and region when it is ECR."""

    registry: str
    repository: str
    tag: str
    ecr_account: str | None = None
    ecr_region: str | None = None

    @property
    def kind(self) -> str:
        return "ecr" if self.ecr_region else "registry"

    @property
    def tagged(self) -> str:
        return f"{self.repository}:{self.tag}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.registry,
            "kind": self.kind,
            "ecr_account": self.ecr_account,
            "ecr_region": self.ecr_region,
        }


def ecr_host(host: str) -> re.Match[str] | None:
    """The account and region of an ECR registry host, or None for any other registry."""
    return ECR_HOST.fullmatch(host)


def default_tag(base: Image, efa_version: str) -> str:
    """`<the base's tag, or 12 hex of its digest>-efa<version>`: v0.1.0-efa1.49.0 for the seed."""
    head = base.tag or base.digest.removeprefix("sha256:")[:12]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{head}-efa{efa_version}")[:128]


def push_target(push: str, base: Image, tag: str) -> Target:
    """`--push REGISTRY[/NAMESPACE]`: the image goes to `<push>/<the base's name>:<tag>`.

    The registry must be named (a host with a dot or a port, or localhost): a bare `user` would
    mean Docker Hub, which nothing here should reach by accident (write docker.io/user for it).
    """
    push = push.strip().rstrip("/")
    host, _, path = push.partition("/")
    if (
        not host
        or not _HOST.fullmatch(host)
        or not ("." in host or ":" in host or host == "localhost")
    ):
        raise BadInput(
            f"--push {push!r}: expected a registry host (with a dot or a port, or localhost) "
            "and an optional namespace, e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com, "
            "registry.example.com/team or 127.0.0.1:5000."
        )
    parts = [p for p in path.split("/") if p] if path else []
    bad = [p for p in parts if not _COMPONENT.fullmatch(p)]
    if bad:
        raise BadInput(f"--push {push!r}: {bad[0]!r} is not a repository path component.")
    if not _TAG.fullmatch(tag):
        raise BadInput(f"--tag {tag!r}: expected up to 128 letters, digits, '_', '.' or '-'.")
    name = base.repository.rsplit("/", 1)[-1]
    repository = "/".join([host, *parts, name])
    m = ecr_host(host)
    return Target(
        registry=host,
        repository=repository,
        tag=tag,
        ecr_account=m.group("account") if m else None,
        ecr_region=m.group("region") if m else None,
    )


@dataclass(frozen=True)
class Login:
    """What `docker login` needs; the password never reaches a command line or a file we keep."""

    server: str
    username: str
    password: str

    def __repr__(self) -> str:  # never print the token
        return f"Login(server={self.server!r}, username={self.username!r}, password=<hidden>)"


def ecr_login(
    target: Target, session: Session | None = None, client: ECRClient | None = None
) -> Login:
    """An ECR authorization token (GetAuthorizationToken) as a docker login.

    `client`: an ECR client to use as it is (tests pass one with a Stubber); else one is made
    from `session` or the environment's credentials, in the registry's region.
    """
    if target.ecr_region is None:
        raise BadInput(f"{target.registry} is not an ECR registry.")
    doing = f"ECR login to {target.registry}"
    if client is None:
        from launcher.clusters.aws.session import make_session

        try:
            session = make_session(target.ecr_region, session)
        except BadInput as err:
            raise BadInput(f"{doing}: {err.message}", hint=err.hint) from None
        client = session.client("ecr", region_name=target.ecr_region)
    try:
        data = client.get_authorization_token()["authorizationData"][0]
    except Exception as err:  # noqa: BLE001 - botocore's errors become the launcher's own
        from launcher.clusters.aws.session import translate

        mine = translate(err, doing)
        if mine is err:
            raise InfraError(f"{doing}: {err}") from err
        raise mine from err
    try:
        user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    except (KeyError, ValueError, UnicodeDecodeError) as err:
        raise InfraError(
            f"{doing}: the authorization token is not user:password ({err})."
        ) from None
    if not user or not password:
        raise InfraError(f"{doing}: the authorization token is not user:password.")
    # the token serves every registry these credentials may use; its proxyEndpoint names the
    # caller's own account, which need not be the one pushed to
    return Login(f"https://{target.registry}", user, password)
