#!/bin/sh
# Entrypoint of the sluice Spark image (spark-master, spark-worker-1, spark-worker-2), run under tini.
set -eu

# Arbitrary uid support (docker-compose runs this image as ${AIRFLOW_UID}:0, like the Airflow
# services): the JVM's Hadoop login needs a user *name* for the uid, so add one when the uid has no
# /etc/passwd entry (the image makes /etc/passwd writable by group 0 for this), as the Airflow and
# Spark images do.
if ! whoami >/dev/null 2>&1 && [ -w /etc/passwd ]; then
    echo "sluice:x:$(id -u):0:sluice:/home/sluice:/bin/sh" >> /etc/passwd
fi

# Same umask as the Airflow image's entrypoint: files the daemons create (work folders, logs) stay
# writable by group 0 whatever the uid.
umask 0002

exec "$@"
