"""A SparkSession for the dead-letter jobs: Java checked first, UTC time,
the hutch-dead-letters and hutch-stream data sources registered, and on a cluster the
spark_sink package shipped to the executors (they run its reader)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import zipfile

JAVA_MIN = 17
JAVA_HELP = ("Spark runs on Java %d or newer, which spark_sink could not find: install a JRE "
             "(Debian/Ubuntu: apt-get install default-jre-headless) or set JAVA_HOME." % JAVA_MIN)


class JavaMissing(RuntimeError):
    """Spark cannot start here; the message says what to install."""


def java_command() -> str:
    """The java executable Spark will use (JAVA_HOME first, as Spark does)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise JavaMissing("JAVA_HOME=%s has no bin/java. %s" % (home, JAVA_HELP))
    found = shutil.which("java")
    if not found:
        raise JavaMissing(JAVA_HELP)
    return found


def check_java() -> int:
    """The major version of the Java Spark will use; JavaMissing if none or too old."""
    java = java_command()
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        raise JavaMissing("%s does not run (%s). %s" % (java, exc, JAVA_HELP)) from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise JavaMissing("cannot tell the version of %s. %s" % (java, JAVA_HELP))
    major = int(match.group(1))
    if major == 1:  # "1.8.0_x" style
        major = int(match.group(2) or 0)
    if major < JAVA_MIN:
        raise JavaMissing("%s is Java %d. %s" % (java, major, JAVA_HELP))
    return major


def _package_zip() -> str:
    """spark_sink as a zip for SparkContext.addPyFile."""
    package = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(tempfile.mkdtemp(prefix="spark_sink-"), "spark_sink.zip")
    with zipfile.ZipFile(path, "w") as archive:
        for name in sorted(os.listdir(package)):
            if name.endswith(".py"):
                archive.write(os.path.join(package, name), os.path.join("spark_sink", name))
    return path


def build_session(master: str = "local[*]", app_name: str = "hutch-dead-letters", shuffle_partitions: int = 8):
    check_java()
    from pyspark.sql import SparkSession

    from spark_sink.source import DeadLetterSource, StreamSource

    session = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        session.sparkContext.addPyFile(_package_zip())
    session.dataSource.register(DeadLetterSource)
    session.dataSource.register(StreamSource)
    return session
