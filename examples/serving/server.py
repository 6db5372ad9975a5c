"""A small HTTP inference service instrumented with OpenTelemetry, as an application team writes
one: aiohttp serves a zoo image classifier (random weights, batch 1) and the OpenTelemetry SDK
sends a server span per request over OTLP. Nothing in it knows about xsp's tracing: run it under
``xsp run`` and the model step of each measured request, with its layers, ops and library calls,
becomes a child of that request's span, in its trace.

    python examples/serving/server.py --model torchvision:resnet18 --port 8000
    xsp run --levels MF --iterations 20 --warmup 2 --device cpu \\
        -- python examples/serving/server.py --max-requests 30

Endpoints:
    POST /predict   body: the image as raw bytes, uint8 RGB, channels first (GET /info says its
                    size); answers {"class": i, "score": p}
    GET  /info      the model and its input: {"model", "input_shape", "input_dtype", "input_bytes"}
    GET  /healthz   "ok" once the model is loaded

The server span is made by hand from the W3C ``traceparent`` header through the propagator API
(``opentelemetry.propagate``), with the HTTP semantic conventions' attributes, so no
instrumentation package is needed. Spans go to ``--otlp-endpoint``, else to the standard
``OTEL_EXPORTER_OTLP_*`` variables (OTLP/HTTP; the SDK's default is http://localhost:4318).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

DEFAULT_MODEL = "torchvision:resnet18"
DEFAULT_PORT = 8000
DEFAULT_SERVICE = "serving-demo"
# ImageNet's channel statistics: the torchvision classifiers' expected input normalization
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

log = logging.getLogger("serving-demo")


class Classifier:
    """A zoo image classifier on the CPU, one request at a time (batch 1)."""

    def __init__(self, name: str) -> None:
        from xsp.tracer.workloads import zoo  # the zoo builds models from code: nothing downloads

        workload = zoo.build(name, batch_size=1, mode="infer", device="cpu")
        inputs = workload.inputs
        if workload.entry.task != "classification" or not isinstance(inputs, tuple):
            raise SystemExit(f"serving-demo: {name} is not an image classifier (see `xsp models`)")
        self.name = name
        self.model = workload.model.eval()
        self.shape = tuple(inputs[0].shape[1:])  # (3, H, W)
        self.input_bytes = self.shape[0] * self.shape[1] * self.shape[2]
        self._mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        self._std = torch.tensor(STD).view(1, 3, 1, 1)

    def predict(self, pixels: bytes) -> tuple[int, float]:
        """(class index, its softmax probability) of one image of ``input_bytes`` bytes."""
        with torch.inference_mode():
            image = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(1, *self.shape)
            x = (image.float() / 255.0 - self._mean) / self._std
            probabilities = self.model(x).softmax(dim=1)
            score, index = probabilities.max(dim=1)
            return int(index), float(score)


def tracer_provider(service: str, endpoint: str | None) -> TracerProvider:
    """The SDK's provider with a batching OTLP/HTTP exporter. Its resource carries the host keys
    xsp's spans carry (``host.name``, and ``ip``, the one Jaeger's UI reads), so that Jaeger sees
    the request span and xsp's spans under it as one host's and adjusts no clock skew."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    host = socket.gethostname()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "host.name": host, "ip": host})
    )
    url = endpoint.rstrip("/") + "/v1/traces" if endpoint else None
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def server_spans(tracer: trace.Tracer) -> Any:
    """aiohttp middleware: one SERVER span per request, the child of the caller's span when the
    request carries a W3C ``traceparent`` header, current while the handler runs."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        template = route.canonical if route is not None else request.path
        attributes = {
            "http.request.method": request.method,
            "http.route": template,
            "url.path": request.path,
            "url.scheme": request.scheme,
            "server.address": request.host,
        }
        with tracer.start_as_current_span(
            f"{request.method} {template}",
            context=propagate.extract(request.headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            status = 500  # what aiohttp answers for an exception that is not an HTTP one
            error = None
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            except Exception as exc:
                span.record_exception(exc)
                error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:  # a client's error (4xx) leaves a server span's status unset
                    span.set_status(Status(StatusCode.ERROR, error))

    return middleware


class Service:
    """The routes, one inference thread (the model serves one request at a time while the event
    loop keeps accepting), and the stop after ``max_requests`` predictions (0: never)."""

    def __init__(self, classifier: Classifier, max_requests: int) -> None:
        self.classifier = classifier
        self.max_requests = max_requests
        self.served = 0
        self.stopped = asyncio.Event()
        self._inference = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/predict", self.predict),
            web.get("/info", self.info),
            web.get("/healthz", self.healthz),
        ]

    async def predict(self, request: web.Request) -> web.Response:
        pixels = await request.read()
        expected = self.classifier.input_bytes
        if len(pixels) != expected:
            shape = "x".join(map(str, self.classifier.shape))
            raise web.HTTPBadRequest(
                text=f"expected {expected} bytes ({shape} uint8 RGB, channels first), got {len(pixels)}\n"
            )
        # the request's span stays current in the inference thread: the model step joins it
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        index, score = await loop.run_in_executor(
            self._inference, context.run, self.classifier.predict, pixels
        )
        self.served += 1
        if self.max_requests and self.served >= self.max_requests:
            self.stopped.set()
        return web.json_response({"class": index, "score": score})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model": self.classifier.name,
                "input_shape": list(self.classifier.shape),
                "input_dtype": "uint8",
                "input_bytes": self.classifier.input_bytes,
            }
        )

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def close(self) -> None:
        self._inference.shutdown(wait=True)


async def serve(service: Service, tracer: trace.Tracer, host: str, port: int) -> None:
    """Serve until ``max_requests`` predictions were answered, or SIGINT / SIGTERM."""
    app = web.Application(middlewares=[server_spans(tracer)])
    app.add_routes(service.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, service.stopped.set)
    print(f"serving {service.classifier.name} on http://{host}:{port}", flush=True)
    try:
        await service.stopped.wait()
    finally:
        await runner.cleanup()  # answers the requests in flight, then closes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a zoo image classifier")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--max-requests", type=int, default=0, help="stop after this many predictions (0: never)"
    )
    parser.add_argument(
        "--otlp-endpoint", help="OTLP/HTTP base URL (default: the OTEL_EXPORTER_OTLP_* variables)"
    )
    parser.add_argument(
        "--service-name", default=os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch's intra-op threads (0: its default)"
    )
    args = parser.parse_args(argv)
    if args.max_requests < 0:
        parser.error(f"--max-requests must be 0 or more, not {args.max_requests}")
    if args.threads:
        torch.set_num_threads(args.threads)
    provider = tracer_provider(args.service_name, args.otlp_endpoint)
    trace.set_tracer_provider(provider)
    service = Service(Classifier(args.model), args.max_requests)
    try:
        asyncio.run(serve(service, trace.get_tracer("serving-demo"), args.host, args.port))
    finally:
        service.close()
        provider.shutdown()  # sends the spans still batched
    print(f"served {service.served} predictions", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
