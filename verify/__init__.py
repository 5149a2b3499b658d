"""moepack.verify: integrity of containers (`verify`) and source checkpoints (`verify_source`)."""

from moepack.verify.container import verify
from moepack.verify.report import Damage, Report
from moepack.verify.source import SourceProblem, SourceReport, verify_source

__all__ = ["Damage", "Report", "SourceProblem", "SourceReport", "verify", "verify_source"]
