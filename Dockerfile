# The operator image: multi-stage, non-root, pinned base. (Images cannot be built on the development
# machine, which has no container engine; CI systems with one build it with `docker build .`.
# tests/integration/test_wheel_install.py runs this file's pip steps in a clean virtualenv instead.)
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
# The build backend at the version and hash of the lock, not whichever setuptools is newest that day.
COPY requirements/build.lock ./requirements/
RUN pip install --no-cache-dir --only-binary=:all: --require-hashes --no-deps -r requirements/build.lock
COPY pyproject.toml README.md ./
COPY stormtopo ./stormtopo
RUN pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin stormtopo
# Every dependency at the version and hash of the lock (`make lock`), wheels only, so that two builds
# install the same files; then stormtopo itself, which brings nothing more.
COPY requirements/operator.lock /tmp/operator.lock
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --only-binary=:all: --require-hashes --no-deps -r /tmp/operator.lock \
    && pip install --no-cache-dir --no-deps /wheels/*.whl \
    && pip check \
    && rm -rf /wheels /tmp/operator.lock
# Few malloc arenas: API calls run on worker threads; one arena each fragments memory.
ENV MALLOC_ARENA_MAX=2 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 9443 8080
ENTRYPOINT ["python", "-m", "stormtopo.operator"]
