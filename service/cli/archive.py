"""``casetrail archive verify``: an archive of expired cases' bundles, checked offline
(service/audit/archive_check.py; docs/bundle.md, "Archives")."""

from __future__ import annotations

from typing import Annotated

import orjson
import typer

from casetrail.cli.common import LogToday, TrustAction, TrustLog, TrustWitness, run

archive_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help=(
    "Archives the retention pass writes before cases expire (a policy with --archive)."))


@archive_app.command("verify")
def verify(
    directory: Annotated[str, typer.Argument(help="The archive (CASETRAIL_ARCHIVE_DIR): a "
                                             "directory or s3://bucket[/prefix].")],
    trust: Annotated[list[str], typer.Option(
        "--trust", help="A signing key you trust: KEY[@NOT_VALID_AFTER], or a trust file "
        "of such lines; repeatable. Manifests and events must be signed by one.")],
    trust_log: TrustLog = None, trust_witness: TrustWitness = None,
    trust_action: TrustAction = None, log: LogToday = None,
    s3_endpoint: Annotated[str | None, typer.Option(
        "--s3-endpoint", envvar="CASETRAIL_ARCHIVE_S3_ENDPOINT",
        help="An S3-compatible store's endpoint (default: AWS's).")] = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the whole report as JSON.")]
    = False,
) -> None:
    """Check every manifest's signature, every file's digest and every bundle offline:
    exit 0 verified, 1 not, 2 could not check."""
    from casetrail.audit.archive_check import ArchiveProblem, verify_archive
    from casetrail.audit.archive_store import open_archive
    from casetrail.audit.evidence import BundleError, trusted_keys
    from casetrail.ledger.note import NoteError
    from casetrail.ledger.witness import LogUnreachable, check_log_today, verifier_key

    try:
        store = open_archive(directory, s3_endpoint)
        if not store.names("manifests"):
            raise BundleError(f"{directory} holds no manifests/: not an archive")
        keys = [key for t in trust for key in trusted_keys(t)]
        log_keys = [verifier_key(t) for t in trust_log or []]
        if log is not None and not log_keys:
            raise BundleError("--log needs --trust-log: the log's answers are checked "
                              "against its key")
        report = verify_archive(store, keys, log_keys,
                                [verifier_key(t) for t in trust_witness or []],
                                None if trust_action is None else [
                                    k.public_key for t in trust_action
                                    for k in trusted_keys(t)])
        for file, bundle in report.checked:
            for found in run(check_log_today(log, bundle, log_keys)) if log else []:
                report.problems.append(ArchiveProblem(file, "log", found.message))
    except (OSError, BundleError, NoteError, LogUnreachable) as exc:
        typer.echo(f"could not check {directory}: {exc}", err=True)
        raise typer.Exit(2) from None
    if raw:
        typer.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        verdict = "verified" if report.clean else "NOT verified"
        typer.echo(f"{verdict}: {report.manifests} manifests, {report.verified} of "
                   f"{report.bundles} bundles verified")
        for problem in report.problems:
            typer.echo(f"  {problem.kind}: {problem.file}: {problem.detail}")
    raise typer.Exit(0 if report.clean else 1)
