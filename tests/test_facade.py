import xsp


def test_public_surface_is_pinned() -> None:
    assert xsp.__all__ == [
        "ConfigError",
        "DeviceError",
        "ExportError",
        "Session",
        "StoreError",
        "WorkloadError",
        "XspError",
        "current_session",
        "iteration",
        "session",
        "step",
    ]
    from xsp.tracer.capture.session import Session

    assert xsp.Session is Session
    assert issubclass(xsp.ConfigError, ValueError) and issubclass(xsp.StoreError, xsp.XspError)
