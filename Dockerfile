# loom on Debian 12, built and tested on the CPU (docs/install.md).
#
#   docker build -t loom .
#   docker run --rm --shm-size=1g loom              # ./test.sh: the whole suite
#   docker run --rm --shm-size=1g -v /path/to/data:/data loom ./run.sh --epochs 1 --data /data/cifar-10-batches-bin
#
# --shm-size: ranks on one host exchange tensors through POSIX shared memory (/dev/shm),
# which Docker caps at 64 MiB by default.
FROM debian:12

ENV DEBIAN_FRONTEND=noninteractive
# The packages scripts/setup_deps.sh installs (./test.sh and ./run.sh check them again),
# in a layer of their own so that a change to the sources does not reinstall them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      meson ninja-build pkg-config g++ libopenblas-openmp-dev libdnnl-dev doctest-dev libgloo-dev \
      libtomlplusplus-dev \
      python3 ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /loom
COPY . .
# A build folder copied from the host belongs to another path; start from the sources.
RUN rm -rf build build-* \
 && scripts/build.sh

CMD ["./test.sh"]
