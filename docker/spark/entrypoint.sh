#!/bin/sh
# Entrypoint of the sluice Spark image (spark-master, spark-worker), run under tini.
set -eu

# Arbitrary uid support (docker-compose runs this image as ${AIRFLOW_UID}:0, like the Airflow
# services): the JVM's Hadoop login needs a user *name* for the uid, so add one when the uid has no
# /etc/passwd entry (the image makes /etc/passwd writable by group 0 for this), as the Airflow and
# Spark images do.
if ! whoami >/dev/null 2>&1 && [ -w /etc/passwd ]; then
    echo "sluice:x:$(id -u):0:sluice:/home/sluice:/bin/sh" >> /etc/passwd
fi

# Same umask as the Airflow image's entrypoint: everything created on the shared lake volume stays
# writable by group 0, so drivers (Airflow containers) and executors (here) can share files even when
# their uids differ.
umask 0002

exec "$@"
