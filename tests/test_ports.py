"""Free ports for a later bind: below the kernel's ephemeral range, above Ray's worker ports."""

import socket

from rayrollout import ports


def test_a_free_port_is_bindable_and_outside_the_ranges_others_take_ports_from():
    start = ports.ephemeral_start()
    for _ in range(50):
        port = ports.free_port()
        assert ports.FIRST_PORT_ABOVE_RAY_WORKERS <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_never_chosen(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert not ports.can_bind("127.0.0.1", taken)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        offered = iter([taken, taken, free])
        monkeypatch.setattr(ports._choose, "randrange", lambda low, high: next(offered))
        monkeypatch.setattr(ports, "ephemeral_start", lambda: max(taken, free) + 1000)
        monkeypatch.setattr(ports, "FIRST_PORT_ABOVE_RAY_WORKERS", min(taken, free))
        assert ports.free_port() == free


def test_without_room_below_the_ephemeral_range_the_kernel_chooses(tmp_path, monkeypatch):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.ephemeral_start() == 1024
    port = ports.free_port()
    assert ports.can_bind("127.0.0.1", port)


def test_an_unreadable_range_falls_back_to_linuxs_default(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ports.ephemeral_start() == ports.DEFAULT_EPHEMERAL_START
