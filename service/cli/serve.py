"""``vaeserve serve``: run the HTTP service; ``vaeserve settings``: the settings as the docs list them.

The flags of ``serve`` are made from ``service.settings.Settings`` (pydantic-settings' command-line
source): one declaration gives the flag, its help, its environment variable and its default.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from ..http.app import create_app
from ..http.server import serve as run_server
from ..settings import Settings, settings_markdown
from ..slice.control import exit_process


def add_parsers(sub) -> None:
    """``serve`` (its flags from ``Settings``) and ``settings``."""
    serve = sub.add_parser("serve", help="run the HTTP service (every flag is also a VAESERVE_* variable)",
                           description="Run the HTTP service. Flags override VAESERVE_* environment variables; "
                           "repeatable flags (--warmup, --encode-warmup, --shapes) take one value each time.")
    source: CliSettingsSource[Settings] = CliSettingsSource(Settings, root_parser=serve, cli_kebab_case=True, cli_avoid_json=True,
                               cli_hide_none_type=True, cli_show_env_vars=True, cli_implicit_flags=False)
    for action in serve._actions:  # the metavars the docs use (pydantic-settings writes the Python type)
        field = Settings.model_fields.get(action.dest)
        extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
        if "metavar" in extra:
            action.metavar = extra["metavar"]
    serve.set_defaults(settings_source=source)
    sub.add_parser("settings", help="every setting as a Markdown table (flag, environment variable, default)")


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings of ``vaeserve serve``: flags over environment variables over defaults.

    A repeated flag's values are handed over as one JSON list: pydantic-settings would otherwise
    split each value at its commas (``--warmup 16x21x60x104:uint8,stream`` is one entry)."""
    parsed = {name: [json.dumps(value)] if name in Settings.model_fields and isinstance(value, list) else value
              for name, value in vars(args).items()}
    return Settings(_cli_settings_source=args.settings_source(parsed_args=parsed))


def serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValidationError as error:  # a setting that cannot work: say which, no traceback
        print(f"vaeserve serve: {settings_error(error)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    code = run_server(app, settings)
    worker = app.state.service.worker
    if settings.multi_process or (worker is not None and worker.starting):
        # A slice process, or one stopped while its device thread still loads or compiles: the
        # interpreter's teardown would wait on that thread's runtime, or pull it down under it.
        exit_process(code)
    return code


def settings_error(error: ValidationError) -> str:
    """One line per refused setting: its name (none for a rule between settings) and why."""
    lines = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}" if where else message)
    return "\n".join(lines)


def print_settings(args: argparse.Namespace) -> int:
    print(settings_markdown(), end="")
    return 0
