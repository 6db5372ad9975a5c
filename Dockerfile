# The xsp collector service. It needs none of the tracer's heavy dependencies (torch, the model
# zoos), so only the collector's are installed.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY xsp ./xsp
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir "numpy>=1.26" "pyarrow>=15" "duckdb>=1.0" "opentelemetry-proto>=1.25" \
        "grpcio>=1.60" "aiohttp>=3.10" "click>=8.1" "rich>=13"
VOLUME /data
EXPOSE 4317 4318
ENTRYPOINT ["xsp", "collector", "serve"]
CMD ["--store", "/data", "--grpc", "0.0.0.0:4317", "--http", "0.0.0.0:4318"]
