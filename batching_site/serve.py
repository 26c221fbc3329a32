"""`python -m batching_site.serve ROLE`: become one process of the system.

For containers and for GPU hosts that join an existing system, where there is no
honcho. Every role execs the same command line that `make run` and the tests use
(`batching_site/processes.py`), so what operators deploy is what the tests ran.

    python -m batching_site.serve migrate                      # database migrations, then exit
    python -m batching_site.serve web                          # gunicorn on 127.0.0.1:8000
    python -m batching_site.serve collector                    # one active, any more stand by
    python -m batching_site.serve device cuda:0                # one per GPU, on any host
    python -m batching_site.serve device cuda:0 --preload minilm,synthetic
    python -m batching_site.serve flower --behind-proxy        # under /flower/, staff only at the front door
    python -m batching_site.serve flower                       # on its own: needs FLOWER_BASIC_AUTH=user:password

Every role reads REDIS_URL (and the web, DATABASE_URL) from the environment, and none
starts while a credential still holds .env.example's change-me placeholder.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from . import processes

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")


#: The variables that hold a credential, directly or inside a URL, and the .env entry an
#: operator replaces for each. Never print their values.
CREDENTIALS = {
    "DJANGO_SECRET_KEY": "DJANGO_SECRET_KEY",
    "REDIS_PASSWORD": "REDIS_PASSWORD",
    "REDIS_URL": "REDIS_PASSWORD (in REDIS_URL)",
    "POSTGRES_PASSWORD": "POSTGRES_PASSWORD",
    "DATABASE_URL": "POSTGRES_PASSWORD (in DATABASE_URL)",
    "FLOWER_BASIC_AUTH": "FLOWER_BASIC_AUTH",
}
PLACEHOLDER = "change-me"


def placeholders(environ: Mapping[str, str]) -> list[str]:
    """The credentials in `environ` that still hold .env.example's placeholder, by the
    name to fix. Compose only checks that a value is set, so this is where a copied
    .env.example is caught."""
    return [fix for name, fix in CREDENTIALS.items() if PLACEHOLDER in environ.get(name, "").lower()]


def command(argv: Sequence[str]) -> list[str]:
    """The command line for a role, as `main` would exec it."""
    parser = argparse.ArgumentParser(prog="python -m batching_site.serve", description=__doc__)
    roles = parser.add_subparsers(dest="role", required=True)
    roles.add_parser("migrate", help="apply database migrations and exit")
    web = roles.add_parser("web", help="the Django site on gunicorn")
    # Loopback unless told otherwise: compose says 0.0.0.0 (its web publishes no port).
    web.add_argument("--bind", default="127.0.0.1:8000")
    web.add_argument(
        "--forwarded-allow-ips",
        default="127.0.0.1,::1",
        help="addresses whose X-Forwarded-* gunicorn trusts: the front door's ('*' only where nothing else reaches web)",
    )
    roles.add_parser("sessions", help="delete expired sessions every hour (Django's clearsessions)")
    roles.add_parser("collector", help="the batch collector (one active per system; more stand by)")
    device = roles.add_parser("device", help="a device worker for one GPU (or simulated CPU device)")
    device.add_argument("device", help="cuda:0, cuda:1, ... (or cpu:0 for a simulated device)")
    device.add_argument("--preload", default=None, help="models to load at start (default: DEFAULT_MODEL)")
    flower = roles.add_parser("flower", help="Flower: behind the front door, or with basic auth from FLOWER_BASIC_AUTH")
    flower.add_argument("--port", type=int, default=5555)
    flower.add_argument("--address", default="127.0.0.1", help="listen here (compose: 0.0.0.0, behind the proxy)")
    flower.add_argument(
        "--behind-proxy",
        action="store_true",
        help="serve under /flower/ for the front door, which admits staff only and refuses the control API",
    )
    args = parser.parse_args(list(argv))

    if args.role == "migrate":
        # A database from before the app's label was `dynamic_batching` moves first
        # (dynamic_batching/relabel.py); on any other, batching_relabel does nothing.
        python = shlex.quote(sys.executable)
        return [
            "/bin/sh",
            "-c",
            f"{python} manage.py batching_relabel -v 0 && exec {python} manage.py migrate --no-input",
        ]
    if args.role == "web":
        return processes.web_command(bind=args.bind, forwarded_allow_ips=args.forwarded_allow_ips)
    if args.role == "sessions":
        return processes.sessions_command()
    if args.role == "collector":
        return processes.collector_command()
    if args.role == "device":
        return processes.device_command(args.device, preload=args.preload)
    loopback = args.address in ("127.0.0.1", "::1", "localhost")
    if not (loopback or args.behind_proxy or os.environ.get("FLOWER_BASIC_AUTH")):
        parser.error(
            f"flower would listen on {args.address} with no login: run it --behind-proxy (compose does),"
            " set FLOWER_BASIC_AUTH=user:password, or keep --address 127.0.0.1"
        )
    # Flower reads FLOWER_BASIC_AUTH itself.
    return [*processes.flower_command(port=args.port, behind_proxy=args.behind_proxy), f"--address={args.address}"]


def main(argv: Sequence[str] | None = None) -> None:
    cmd = command(sys.argv[1:] if argv is None else argv)
    found = placeholders(os.environ)
    if found:
        sys.exit(f"replace {PLACEHOLDER} in .env: {', '.join(found)}")
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
