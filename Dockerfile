# The xsp collector service. It needs none of the tracer's heavy dependencies (torch, the model
# zoos), so only the collector's are installed.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY xsp ./xsp
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir "numpy>=1.26" "pyarrow>=15" "duckdb>=1.0" "opentelemetry-proto>=1.25" \
        "grpcio>=1.60" "aiohttp>=3.10" "click>=8.1" "rich>=13"
# the collector's C modules (xsp/collector/native/), built into the image: without them every
# request would be checked in Python, at half the acknowledged rate, and decoded with numpy, at
# less than half the stored rate
ENV XSP_NATIVE_DIR=/opt/xsp-native
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && python -c "from xsp.collector import door, span_columns; door.load(); span_columns.load()" \
 && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
VOLUME /data
EXPOSE 4317 4318
ENTRYPOINT ["xsp", "collector", "serve"]
CMD ["--store", "/data", "--grpc", "0.0.0.0:4317", "--http", "0.0.0.0:4318"]
