#!/usr/bin/env bash
# Bake the native Delta Lake connector (delta-spark + delta-storage and their runtime dependencies) into
# a Spark distribution's jars/ directory, at image build time. Used by both images of the compose stack:
#   docker/spark/Dockerfile   -> /opt/spark/jars (the standalone master, worker and executors)
#   docker/airflow/Dockerfile -> <site-packages>/pyspark/jars (the drivers spark-submit starts there)
# The driver and the executors need the same jars: the driver plans Delta reads/commits, executors
# write the files.
#
# Environment:
#   DELTA_VERSION          Delta Lake release, e.g. 4.4.1 (delta-spark on PyPI has the same version)
#   DELTA_SPARK_ARTIFACT   Maven artifact, e.g. delta-spark_4.2_2.13: since Delta 4.x the artifact
#                          names the Spark minor it was built for (delta-spark_<spark major.minor>_<scala>),
#                          the same rule delta-spark's configure_spark_with_delta_pip() follows.
#   SPARK_HOME             optional; defaults to the pip-installed pyspark package directory.
#   DELTA_SMOKE_TEST       1 (default) to prove the result by writing and reading a Delta table.
#
# Why resolve instead of `curl`-ing two jars: since Delta 4.x delta-spark's POM also depends on
# delta-kernel-api/-defaults/-unitycatalog and the Unity Catalog client jars, and that list changes
# between releases. Spark's own Ivy resolver (the machinery behind --packages) resolves it exactly as a
# `--packages` run would, once, at build time, so containers never touch Maven at run time. Only jars
# that Spark does not already ship are copied: delta-spark's POM also pulls older jackson/slf4j/log4j
# (delta-io/delta#7415) that must not sit next to, and shadow, Spark's own versions.
set -euo pipefail

: "${DELTA_VERSION:?set DELTA_VERSION, e.g. 4.4.1}"
: "${DELTA_SPARK_ARTIFACT:?set DELTA_SPARK_ARTIFACT, e.g. delta-spark_4.2_2.13}"
SPARK_HOME="${SPARK_HOME:-$(python3 -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export SPARK_HOME
jars_dir="${SPARK_HOME}/jars"
packages="io.delta:${DELTA_SPARK_ARTIFACT}:${DELTA_VERSION},io.delta:delta-storage:${DELTA_VERSION}"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
ivy="${work}/ivy"

# 1. Resolve. spark-submit resolves --packages (transitively, Maven Central) before it starts the
#    application; the application itself is a no-op script.
echo "pass" > "${work}/resolve.py"
"${SPARK_HOME}/bin/spark-submit" \
    --master "local[1]" \
    --conf spark.ui.enabled=false \
    --conf "spark.jars.ivy=${ivy}" \
    --packages "${packages}" \
    "${work}/resolve.py"

# 2. Copy what Spark lacks. Ivy retrieves files as <org>_<artifact>-<revision>.jar into ${ivy}/jars and
#    caches them as ${ivy}/cache/<org>/<artifact>/<type>s/<artifact>-<revision>.jar; the cache path gives
#    the artifact name exactly (names like log4j-1.2-api or delta-spark_4.2_2.13 defeat regexes).
artifact_of() {
    local file="$1" org rest cached
    org="${file%%_*}"
    rest="${file#*_}"
    cached="$(find "${ivy}/cache/${org}" -mindepth 3 -maxdepth 3 -name "${rest}" -print -quit 2>/dev/null || true)"
    if [[ -n "${cached}" ]]; then
        basename "$(dirname "$(dirname "${cached}")")"
    else
        # Fallback: strip the revision (first "-<digit>" onwards).
        sed -E 's/-[0-9].*\.jar$//' <<<"${rest}"
    fi
}

shopt -s nullglob
added=0
for jar in "${ivy}"/jars/*.jar; do
    file="${jar##*/}"
    rest="${file#*_}"
    artifact="$(artifact_of "${file}")"
    existing=("${jars_dir}/${artifact}"-[0-9]*.jar)
    if ((${#existing[@]})); then
        echo "skip ${file}: Spark already ships ${existing[*]##*/}"
        continue
    fi
    cp "${jar}" "${jars_dir}/${rest}"
    echo "add  ${rest}"
    added=$((added + 1))
done

for required in "${DELTA_SPARK_ARTIFACT}-${DELTA_VERSION}.jar" "delta-storage-${DELTA_VERSION}.jar"; do
    if [[ ! -f "${jars_dir}/${required}" ]]; then
        echo "ERROR: ${required} is not in ${jars_dir} after resolution" >&2
        exit 1
    fi
done
echo "installed ${added} jar(s) into ${jars_dir}"

# 3. Prove it: a session with the Delta extension writes and reads back a table. Catches a missing
#    transitive class (NoClassDefFoundError) at build time instead of in the first DAG run.
if [[ "${DELTA_SMOKE_TEST:-1}" == "1" ]]; then
    python3 - "${work}/smoke" <<'PY'
import sys

from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .appName("delta-smoke")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate()
)
path = sys.argv[1]
spark.range(3).write.format("delta").save(path)
count = spark.read.format("delta").load(path).count()
version = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").first()["version"]
spark.stop()
assert count == 3 and version == 0, (count, version)
print(f"delta smoke test ok: {count} rows at version {version}")
PY
fi
