#!/usr/bin/python3
"""Drives roam-desktop in a throwaway X server and session bus, as a person would through AT-SPI.

A fake agent answers on a control socket in a temporary directory with the documented JSON
(docs/CONTROL.md): `status`, `watch` (a status event, then a transition event for each change),
`up` and `down`. The script checks the Welcome screen (no profile, no agent), the Details screen
(the state label reads what the fake reports, the switch is on), that flipping the switch makes
the fake receive `down` and the label follow, and the portal banner; it saves a screenshot of
each screen. With --real-agent SOCKET the app is pointed at a real `agent up` instead (a lab's,
DesktopLabTests), whose own `agent status` is checked against what the window shows: the switch
taking it down and up, and a profile's "Use" button making it start again on that profile.
Exit status: 0 passed, 1 failed (what failed on stderr), 77 skipped (why on stdout).

Every process it starts is ended by its id; the temporary directory is removed.
"""

import argparse
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77


def status(state, **extra):
    """A client's status, with the fields and shapes the agent's ClientStatus writes."""
    path = None if state in ("paused", "offline", "disconnected") else {
        "interface": "wifi0" if state == "portal" else "eth0",
        "kind": "wifi" if state == "portal" else "ethernet",
        "source": "10.31.1.2" if state == "portal" else "10.31.2.2", "transport": "udp"}
    body = {
        "role": "client", "state": state,
        "server": {"name": "fra1", "address": "198.51.100.7:51820"},
        "path": path, "ssid": "Hotel Lobby" if state == "portal" else None,
        "profile": {"name": "work", "file": "/etc/roam/work.yaml"}, "profiles": ["home", "work"],
        "rtt_ms": 1.051 if state == "connected" else None,
        "mtu": {"tunnel": 1340, "configured": 1420, "floor": 1280, "searching": False, "size_probes": 9},
        "since": "2026-11-23T18:05:17Z", "for_ms": 5310.2,
        "last_transition": {"at": "2026-11-23T18:05:17Z", "from": "connecting", "to": state, "trigger": "handshake-ok",
                            "reason": "handshakeCompleted", "path": path, "attempt": 0, "coalesced": 0},
        "attempts": 1, "budget_left": 9, "connectivity_checks": 0, "power": "ac",
        "session": {"protocol": 3, "cipher": "aes-256-gcm"} if state == "connected" else None,
        "lockdown": {"enabled": True, "blocked": {"dns": 0, "ipv6": 0, "out": 12, "in": 0, "forward": 0, "inner": 0},
                     "open_on": None, "exceptions_for": "agent", "refused_loads": 0},
        "excluded": [{"pid": 4242, "name": "steam"}],
    }
    body.update(extra)
    return body


class FakeAgent:
    """A control socket that answers as a client agent does, on a thread of its own."""

    def __init__(self, path):
        self.path = path
        self.state = status("connected")
        self.received = []
        self.watchers = []
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stopping:
            ready, _, _ = select.select([self.listener], [], [], 0.2)
            if not ready:
                continue
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(connection,), daemon=True).start()

    def answer(self, connection):
        connection.settimeout(2)
        line = b""
        try:
            while not line.endswith(b"\n") and len(line) < 4096:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                line += chunk
        except OSError:
            connection.close()
            return
        text = line.decode().strip()
        request = json.loads(text) if text.startswith("{") else {"command": text}
        command = request["command"]
        with self.lock:
            self.received.append(command + (" " + request["profile"] if "profile" in request else ""))
            if command == "watch":
                self.send(connection, {"version": 1, "event": "status", "status": self.state})
                self.watchers.append(connection)
                return
            if command == "status":
                self.send(connection, {"version": 1, "ok": True, "status": self.state})
            elif command == "use-profile":
                # The agent starts again with the profile: a watcher sees it stop and comes back.
                self.send(connection, {"version": 1, "ok": True, "message": "switching to " + request["profile"],
                                       "state": self.state["state"]})
                self.change(dict(self.state, profile={"name": request["profile"],
                                                      "file": "/etc/roam/%s.yaml" % request["profile"]}))
            elif command in ("down", "up"):
                self.send(connection, {"version": 1, "ok": True, "message": command, "state": self.state["state"]})
                self.change(status("paused" if command == "down" else "connected"))
            else:
                self.send(connection, {"version": 1, "ok": False,
                                       "error": {"code": "unknown-command", "message": "unknown command"}})
        connection.close()

    @staticmethod
    def send(connection, message):
        try:
            connection.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            pass

    def change(self, new):
        """Takes a new state and tells every watcher, as the agent's transition events do."""
        before = self.state["state"]
        self.state = new
        event = {"version": 1, "event": "transition",
                 "transition": {"at": "2026-11-23T18:06:00Z", "from": before, "to": new["state"], "trigger": "operator",
                                "reason": "operator", "path": new["path"], "attempt": 0, "coalesced": 0},
                 "status": new}
        for watcher in self.watchers:
            self.send(watcher, event)

    def set(self, new):
        with self.lock:
            self.change(new)

    def close(self):
        self.stopping = True
        self.thread.join(timeout=2)
        self.listener.close()
        with self.lock:
            for watcher in self.watchers:
                watcher.close()


def children():
    """The script's own children that still run (its subprocesses and the orphans it adopted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(entry))
    return found


class Session:
    """Xvfb, a session bus and the app, each ended by its id."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.processes = []
        self.display_pipe = None

    def start(self, argv, **kwargs):
        process = subprocess.Popen(argv, **kwargs)
        self.processes.append(process)
        return process

    def x_server(self):
        if shutil.which("Xvfb") is None:
            return None, "Xvfb is not installed (scripts/setup installs it)"
        read, write = os.pipe()
        process = self.start(["Xvfb", "-displayfd", str(write), "-screen", "0", "1024x768x24", "-nolisten", "tcp",
                              # Without it the server resets as its last client leaves, refusing whoever connects then.
                              "-noreset"],
                             pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.scratch, "xvfb.log"), "wb"))
        os.close(write)
        # Xvfb may write the number and its newline apart, and dies if it cannot write: read the
        # whole line, and keep the pipe open as long as the server runs.
        self.display_pipe = read
        said = b""
        deadline = time.monotonic() + 10
        while not said.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([read], [], [], max(0, deadline - time.monotonic()))
            chunk = os.read(read, 32) if ready else b""
            if not chunk:
                break
            said += chunk
        number = said.decode().strip() if said.endswith(b"\n") else ""
        if not number:
            error = ""
            if process.poll() is not None:
                with open(os.path.join(self.scratch, "xvfb.log"), errors="replace") as log:
                    error = log.read().strip().splitlines()[-1:]
            return None, "Xvfb did not start within 10 s: %s" % (error or "no display number")
        return ":" + number, None

    def bus(self, env):
        process = self.start(["dbus-daemon", "--session", "--nofork", "--print-address=1"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready, _, _ = select.select([process.stdout], [], [], 10)
        if not ready:
            raise RuntimeError("dbus-daemon gave no address within 10 s")
        return process.stdout.readline().decode().strip()

    def notification_server(self, env):
        """dunst on this session's bus; None when it did not take org.freedesktop.Notifications."""
        if shutil.which("dunst") is None or shutil.which("dunstctl") is None:
            return None
        self.start(["dunst"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if subprocess.run(["dunstctl", "is-paused"], env=env, capture_output=True, timeout=5).returncode == 0:
                return True
            time.sleep(0.2)
        return None

    def strays(self):
        """Processes the session started indirectly: the accessibility bus's launcher starts a
        dbus-daemon that outlives the session bus, known by its address in this session's runtime
        directory."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as cmdline:
                    if self.scratch.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def end(self):
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        if self.display_pipe is not None:
            os.close(self.display_pipe)
        # It ignores SIGTERM. What the buses started (the accessibility registry, a notification
        # server started on demand) and the programs the app started are orphans now: as their
        # subreaper the script ends what still runs and reaps them all.
        for pid in self.strays() + children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)


def walk(node, depth=0):
    """Every accessible under `node` (bounded: a window has far fewer than this)."""
    if node is None or depth > 40:
        return
    yield node
    for i in range(min(node.get_child_count(), 500)):
        yield from walk(node.get_child_at_index(i), depth + 1)


def find(Atspi, predicate, within=10.0, what="an accessible"):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        desktop = Atspi.get_desktop(0)
        for i in range(desktop.get_child_count()):
            application = desktop.get_child_at_index(i)
            if application is None or application.get_name() != "roam-desktop":
                continue
            for node in walk(application):
                try:
                    if predicate(node):
                        return node
                except Exception:
                    continue
        time.sleep(0.2)
    raise AssertionError("did not find %s within %.0f s" % (what, within))


def resident(pid):
    """The process's resident memory, as /proc says it (VmRSS, and its peak VmHWM)."""
    with open("/proc/%d/status" % pid) as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return "VmRSS %s, peak VmHWM %s" % (fields["VmRSS"].strip(), fields["VmHWM"].strip())


class DebianWatcher:
    """Debian's StatusNotifierWatcher (`status-notifier-watcher`, from gtk-sni-tray) started in the
    session as a desktop's tray host would; the items are what it says is registered, and the
    items' signals are heard on a thread with its own GLib main loop."""

    def __init__(self, session, env):
        from gi.repository import Gio, GLib
        self.Gio, self.GLib = Gio, GLib
        self.signals = []
        self.process = session.start(["status-notifier-watcher"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise AssertionError("status-notifier-watcher did not take its name on the bus within 10 s")

    def run(self):
        Gio, GLib = self.Gio, self.GLib
        self.context = GLib.MainContext.new()
        self.context.push_thread_default()
        self.bus = Gio.bus_get_sync(Gio.BusType.SESSION, None)
        self.bus.signal_subscribe(None, "org.kde.StatusNotifierItem", None, "/StatusNotifierItem", None,
                                  Gio.DBusSignalFlags.NONE, self.heard)
        self.bus.signal_subscribe(None, "com.canonical.dbusmenu", None, "/MenuBar", None,
                                  Gio.DBusSignalFlags.NONE, self.heard)
        self.loop = GLib.MainLoop.new(self.context, False)
        # Ready once the watcher owns its name on the bus.
        Gio.bus_watch_name_on_connection(self.bus, "org.kde.StatusNotifierWatcher", Gio.BusNameWatcherFlags.NONE,
                                         lambda *_: self.ready.set(), None)
        self.loop.run()

    @property
    def items(self):
        """(None, the item's bus name) for each item the watcher has registered."""
        try:
            registered = self.call("org.kde.StatusNotifierWatcher", "/StatusNotifierWatcher", "org.freedesktop.DBus.Properties",
                                   "Get", self.GLib.Variant("(ss)", ("org.kde.StatusNotifierWatcher",
                                                                     "RegisteredStatusNotifierItems")), "(v)")[0]
        except Exception:
            return []
        return [(None, entry.split("/", 1)[0]) for entry in registered]

    def heard(self, bus, sender, path, interface, signal, parameters):
        self.signals.append(signal)

    def call(self, name, path, interface, method, parameters, reply):
        """A method call on the bus, from another connection than the loop's thread."""
        Gio, GLib = self.Gio, self.GLib
        bus = Gio.bus_get_sync(Gio.BusType.SESSION, None)
        return bus.call_sync(name, path, interface, method, parameters, GLib.VariantType(reply) if reply else None,
                             Gio.DBusCallFlags.NONE, 5000, None).unpack()

    def stop(self):
        self.loop.quit()
        self.thread.join(timeout=5)


def check_tray(watcher, agent):
    """The item registered with the watcher that appeared after the app; its menu's labels; a
    click on Disconnect sends `down`; the state change that follows gives a new icon."""
    wait_for(lambda: watcher.items, 10, "the tray item did not register with the watcher")
    name = watcher.items[0][1]
    GLib = watcher.GLib
    icon = watcher.call(name, "/StatusNotifierItem", "org.freedesktop.DBus.Properties", "Get",
                        GLib.Variant("(ss)", ("org.kde.StatusNotifierItem", "IconName")), "(v)")[0]
    _, layout = watcher.call(name, "/MenuBar", "com.canonical.dbusmenu", "GetLayout",
                             GLib.Variant("(iias)", (0, -1, [])), "(u(ia{sv}av))")
    entries = [(child[0], child[1].get("label")) for child in layout[2]]
    labels = [label for _, label in entries]
    expected = ["Log in to the network", "Disconnect", "Profiles", "home", "work (in use)", "Open Roam", "Quit"]
    if labels != expected:
        raise AssertionError("the tray menu reads %s, not %s" % (labels, expected))
    downs = agent.received.count("down")
    heard = len(watcher.signals)
    disconnect = dict((label, id) for id, label in entries)["Disconnect"]
    watcher.call(name, "/MenuBar", "com.canonical.dbusmenu", "Event",
                 GLib.Variant("(isvu)", (disconnect, "clicked", GLib.Variant("s", ""), 0)), None)
    wait_for(lambda: agent.received.count("down") > downs, 10, "Disconnect in the tray menu did not send down")
    wait_for(lambda: "NewIcon" in watcher.signals[heard:], 10, "the state change after down gave no NewIcon")
    home = dict((label, id) for id, label in entries)["home"]
    watcher.call(name, "/MenuBar", "com.canonical.dbusmenu", "Event",
                 GLib.Variant("(isvu)", (home, "clicked", GLib.Variant("s", ""), 0)), None)
    wait_for(lambda: "use-profile home" in agent.received, 10, "home in the tray menu did not send use-profile home")
    _, layout = watcher.call(name, "/MenuBar", "com.canonical.dbusmenu", "GetLayout",
                             GLib.Variant("(iias)", (0, -1, [])), "(u(ia{sv}av))")
    after = [child[1].get("label") for child in layout[2]]
    print("tray: %s registered (icon %s); menu %s; Disconnect sent down; then NewIcon and menu %s; home sent use-profile home" % (
        name, icon, labels, after))


def displayed(env):
    """How many notifications dunst shows now."""
    count = subprocess.run(["dunstctl", "count", "displayed"], env=env, capture_output=True, timeout=5)
    return int(count.stdout.decode().strip() or "-1")


def wait_for(condition, within, what):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("%s within %.0f s" % (what, within))


def check_notifications(agent, env, display, scratch, screenshots):
    """The portal (shown by now) raised one notification; news replaces it rather than adding
    one; its "Log in" action runs `agent portal`."""
    wait_for(lambda: displayed(env) == 1, 10, "no notification for the portal")
    screenshot(display, os.path.join(screenshots, "notification.png"), window=None)
    agent.set(status("failed", last_transition={"at": "2026-11-23T18:06:00Z", "from": "connecting", "to": "failed",
                                                "trigger": "handshake-failed", "reason": "rejected(unknown key)",
                                                "path": None, "attempt": 3, "coalesced": 0}))
    time.sleep(1)
    if displayed(env) != 1:
        raise AssertionError("a failure after the portal shows %d notifications, not one replaced" % displayed(env))
    agent.set(status("portal", portal={"url": "https://login.hotel.example/", "window_ms": None, "next_check_ms": 1.0}))
    time.sleep(1)
    if displayed(env) != 1:
        raise AssertionError("the portal again shows %d notifications, not one replaced" % displayed(env))
    # dunst invokes a notification's only action.
    subprocess.run(["dunstctl", "action", "0"], env=env, capture_output=True, timeout=5)
    said = os.path.join(scratch, "portal-arguments")
    wait_for(lambda: os.path.exists(said), 10, "the notification's Log in did not run agent portal")
    with open(said) as arguments:
        words = arguments.read().split()
    expected = ["portal", "--control", env["ROAM_CONTROL_SOCKET"], "--run", "xdg-open", "https://login.hotel.example/"]
    if words != expected:
        raise AssertionError("Log in ran agent %s, not agent %s" % (" ".join(words), " ".join(expected)))
    print("notification: one for the portal, replaced by the failure and the portal again; "
          "its Log in ran agent " + " ".join(words))


def check_import(Atspi, scratch, agent_binary, display, screenshots):
    """The Welcome screen's import, through GTK's file chooser: a broken profile is refused by the
    check with its line and never reaches pkexec; a good one goes to the fake pkexec with only
    the helper and the name as arguments and the file's bytes on standard input, never the key."""
    folder = os.path.join(scratch, "import")
    os.mkdir(folder)
    key_file = os.path.join(folder, "work.key")
    public = subprocess.run([agent_binary, "keygen", "--out", key_file], capture_output=True, timeout=20, check=True)
    with open(key_file) as key:
        secret = key.read().strip()
    profile = "server: 192.0.2.1:51820\nserver-key: %s\nprivate-key-file: %s\n" % (public.stdout.decode().strip(), key_file)
    with open(os.path.join(folder, "broken.yaml"), "w") as broken:
        broken.write(profile.replace("private-key-file", "mode: sideways\nprivate-key-file", 1))
    with open(os.path.join(folder, "work.yaml"), "w") as work:
        work.write(profile)

    def choose(path):
        button = find(Atspi, lambda n: n.get_name() == "Import a profile\u2026" and n.get_n_actions() > 0,
                      what='the "Import a profile\u2026" button')
        wait_for(lambda: button.get_state_set().contains(Atspi.StateType.SENSITIVE), 10, "the import button stayed busy")
        button.do_action(0)
        # GTK 4.8 gives the dialog no window role: it is known by its title.
        dialog = find(Atspi, lambda n: n.get_name() == "Import a profile", what="the file chooser")
        time.sleep(1)
        # GTK's chooser opens its location entry on a typed "/"; Enter chooses the file.
        Atspi.generate_keyboard_event(0, path, Atspi.KeySynthType.STRING)
        time.sleep(0.5)
        Atspi.generate_keyboard_event(0xff0d, None, Atspi.KeySynthType.PRESSRELEASE | Atspi.KeySynthType.SYM)
        wait_for(lambda: dialog.get_state_set().contains(Atspi.StateType.DEFUNCT) or not dialog.get_state_set().contains(
            Atspi.StateType.VISIBLE), 10, "the file chooser did not close after Enter")

    choose(os.path.join(folder, "broken.yaml"))
    refused = find(Atspi, lambda n: n.get_description() == "Import status" and "broken.yaml:3:" in (n.get_name() or ""),
                   what="the broken profile's mistake with its line").get_name()
    if os.path.exists(os.path.join(scratch, "pkexec-arguments")):
        raise AssertionError("a profile the check refused went on to pkexec")
    time.sleep(0.5)
    screenshot(display, os.path.join(screenshots, "import-refused.png"))

    choose(os.path.join(folder, "work.yaml"))
    installed = find(Atspi, lambda n: n.get_description() == "Import status" and "roam@work" in (n.get_name() or ""),
                     what="the installed profile's message").get_name()
    with open(os.path.join(scratch, "pkexec-arguments")) as arguments:
        argv = arguments.read().split("\n")[:-1]
    with open(os.path.join(scratch, "pkexec-input")) as given:
        stdin = given.read()
    if argv != ["/usr/libexec/roam/install-profile", "work"]:
        raise AssertionError("pkexec was given %s" % argv)
    if any(secret in word for word in argv) or secret in stdin:
        raise AssertionError("the private key went to pkexec")
    if stdin != profile:
        raise AssertionError("pkexec's standard input was %r, not the profile" % stdin)
    print("import: %r refused before pkexec; work.yaml installed through pkexec %s with the profile on standard "
          "input and no key; the screen says %r" % (refused, " ".join(argv), installed))


class RealAgent:
    """A real `agent up`, asked through its control socket by the agent's own commands; `netns` is
    the namespace it runs in, where its lockdown is."""

    def __init__(self, agent_binary, socket_path, netns):
        self.agent = agent_binary
        self.socket = socket_path
        self.netns = netns

    def status(self):
        """Its status (docs/CONTROL.md), or None while nothing answers (it is starting again)."""
        said = subprocess.run([self.agent, "status", "--json", "--control", self.socket], capture_output=True, timeout=10)
        if said.returncode != 0:
            return None
        try:
            answer = json.loads(said.stdout)
        except ValueError:
            return None
        return answer.get("status", answer)

    def wait(self, condition, within, what):
        """Waits for the status to meet `condition`; returns it, or fails with the last one seen."""
        deadline = time.monotonic() + within
        last = None
        while time.monotonic() < deadline:
            last = self.status()
            if last is not None and condition(last):
                return last
            time.sleep(0.2)
        raise AssertionError("%s within %.0f s; its status: %s" % (what, within, json.dumps(last)))

    def ask(self, command, profile):
        """Sends one request on the socket and returns the answer's line (it must come within 10 s)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(self.socket)
            connection.sendall((json.dumps({"version": 1, "command": command, "profile": profile}) + "\n").encode())
            said = b""
            while not said.endswith(b"\n"):
                chunk = connection.recv(4096)
                if not chunk:
                    break
                said += chunk
        if not said.endswith(b"\n"):
            raise AssertionError("%s %s: the agent hung up before answering (%r)" % (command, profile, said))
        return json.loads(said)

    def lockdown_loaded(self):
        return subprocess.run(["ip", "netns", "exec", self.netns, "nft", "list", "table", "inet", "roam"],
                              capture_output=True, timeout=10).returncode == 0


class LockdownWatch:
    """Looks at the lockdown's table every 50 ms on a thread of its own, counting the looks that
    did not find it."""

    def __init__(self, agent):
        self.agent = agent
        self.looks = 0
        self.missing = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopping.wait(0.05):
            self.looks += 1
            if not self.agent.lockdown_loaded():
                self.missing += 1

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=15)


def check_real_agent(Atspi, agent, other, display, screenshots):
    """The window against a real client agent: Connected and its server; the switch taking the
    agent down and up; "Use OTHER" making it start again on that profile, the lockdown loaded
    throughout; and a use-profile asked on the socket answered before the agent restarts."""
    def label(text, within=20):
        return find(Atspi, lambda n: n.get_description() == "Tunnel state" and n.get_name() == text, within=within,
                    what='the state label reading "%s"' % text)

    def connected_on(profile):
        return lambda s: s["state"] == "connected" and (s.get("profile") or {}).get("name") == profile

    first = agent.wait(lambda s: s["state"] == "connected", 20, "the agent did not connect")
    own = first["profile"]["name"]
    if other not in (first.get("profiles") or []):
        raise AssertionError("the agent lists the profiles %s, without %s" % (first.get("profiles"), other))
    label("Connected")
    server = "%s (%s)" % (first["server"]["name"], first["server"]["address"])
    find(Atspi, lambda n: n.get_name() == server, what="the server's row reading %r" % server)
    toggle = find(Atspi, lambda n: n.get_name() == "Tunnel" and n.get_n_actions() > 0, what="the switch")
    if not toggle.get_state_set().contains(Atspi.StateType.CHECKED):
        raise AssertionError("the switch is off while the agent is connected")
    time.sleep(0.5)
    screenshot(display, os.path.join(screenshots, "lab-connected.png"))
    print("real agent: the window says Connected through %s, as the agent's status does" % server)

    toggle.do_action(0)
    agent.wait(lambda s: s["state"] == "paused", 15, "the switch turned off did not take the agent down")
    label("Off")
    wait_for(lambda: not toggle.get_state_set().contains(Atspi.StateType.CHECKED), 10, "the switch stayed on while the agent is down")
    toggle.do_action(0)
    agent.wait(lambda s: s["state"] == "connected", 20, "the switch turned on did not reconnect the agent")
    label("Connected")
    print("real agent: the switch took it down (paused, the label Off) and up again (connected, the label Connected)")

    use = find(Atspi, lambda n: n.get_name() == "Use " + other and n.get_n_actions() > 0, what='the "Use %s" button' % other)
    watch = LockdownWatch(agent)
    try:
        started = time.monotonic()
        use.do_action(0)
        switched = agent.wait(connected_on(other), 30, "Use %s did not make the agent connect on %s" % (other, other))
        took = time.monotonic() - started
    finally:
        watch.stop()
    if not (switched.get("lockdown") or {}).get("enabled"):
        raise AssertionError("the lockdown is off after the switch: %s" % json.dumps(switched.get("lockdown")))
    if watch.missing or not watch.looks:
        raise AssertionError("the lockdown's table was missing %d of %d looks during the switch" % (watch.missing, watch.looks))
    label("Connected")
    find(Atspi, lambda n: n.get_name() == "Use " + own and n.get_n_actions() > 0, what='the "Use %s" button once %s runs' % (own, other))
    print("real agent: Use %s restarted it on %s (%s), connected %.1f s after the press, the lockdown loaded in all %d looks; "
          "the label is Connected again" % (other, switched["profile"]["name"], switched["profile"]["file"], took, watch.looks))

    answer = agent.ask("use-profile", own)
    if not answer.get("ok"):
        raise AssertionError("use-profile %s was answered %s" % (own, json.dumps(answer)))
    agent.wait(connected_on(own), 30, "use-profile %s did not make the agent connect on it" % own)
    label("Connected")
    print("real agent: use-profile %s asked on the socket was answered %r before the restart, and it connected on %s" % (
        own, answer.get("message"), own))


def screenshot(display, path, window="Roam"):
    """The window named `window` (None: the whole screen), as X shows it, to a PNG."""
    which = ["-name", window] if window else ["-root"]
    window = subprocess.run(["xwd", "-silent", *which, "-display", display], capture_output=True, timeout=20)
    if window.returncode != 0:
        raise AssertionError("xwd: " + window.stderr.decode(errors="replace"))
    pnm = subprocess.run(["xwdtopnm"], input=window.stdout, capture_output=True, timeout=20)
    png = subprocess.run(["pnmtopng"], input=pnm.stdout, capture_output=True, timeout=20)
    if png.returncode != 0 or not png.stdout:
        raise AssertionError("pnmtopng made no picture")
    with open(path, "wb") as out:
        out.write(png.stdout)
    print("screenshot: " + path)


def main():
    # Orphans of what this script starts become its children (PR_SET_CHILD_SUBREAPER), so it can
    # end and reap them.
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--screenshots", required=True)
    parser.add_argument("--real-agent", metavar="SOCKET", help="a real client agent's control socket, instead of the fake")
    parser.add_argument("--netns", help="with --real-agent: the network namespace it runs in")
    parser.add_argument("--profiles", help="with --real-agent: the directory of its profiles")
    parser.add_argument("--other-profile", help="with --real-agent: the profile to switch to")
    arguments = parser.parse_args()

    missing = [tool for tool in ("dbus-daemon", "xwd", "xwdtopnm", "pnmtopng") if shutil.which(tool) is None]
    if missing:
        print("SKIP: %s not installed (scripts/setup installs them)" % ", ".join(missing))
        return SKIP
    os.makedirs(arguments.screenshots, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="roam-desktop-")
    session = Session(scratch)
    agent = None
    try:
        display, problem = session.x_server()
        if display is None:
            print("SKIP: " + problem)
            return SKIP
        profiles = os.path.join(scratch, "profiles")
        runtime = os.path.join(scratch, "runtime")
        os.mkdir(profiles)
        os.mkdir(runtime, 0o700)
        env = dict(os.environ, DISPLAY=display, XDG_RUNTIME_DIR=runtime, GSETTINGS_BACKEND="memory",
                   NO_AT_BRIDGE="0", GTK_A11Y="atspi", ROAM_PROFILES=arguments.profiles or profiles,
                   ROAM_CONTROL_SOCKET=arguments.real_agent or os.path.join(scratch, "agent.sock"))
        env.pop("WAYLAND_DISPLAY", None)
        env["DBUS_SESSION_BUS_ADDRESS"] = session.bus(env)
        os.environ.update(env)
        import gi
        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi
        Atspi.init()

        # The agent's `portal` command, as the app runs it for "Log in": here it writes down its
        # arguments. Its other commands (the import's check) are the real agent's.
        agent_stub = os.path.join(scratch, "agent")
        with open(agent_stub, "w") as stub:
            stub.write('#!/bin/sh\nif [ "$1" != portal ]; then exec "%s" "$@"; fi\nprintf "%%s\\n" "$@" > "%s"\n' % (
                arguments.agent, os.path.join(scratch, "portal-arguments")))
        os.chmod(agent_stub, 0o755)
        env["ROAM_AGENT"] = agent_stub
        # pkexec, as the import runs it: here it writes down its arguments and standard input.
        bin_dir = os.path.join(scratch, "bin")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "pkexec"), "w") as fake:
            fake.write('#!/bin/sh\nprintf "%%s\\n" "$@" > "%s"\ncat > "%s"\n'
                       'echo "installed /etc/roam/$2.yaml: a client configuration; start it with: systemctl start roam@$2"\n'
                       % (os.path.join(scratch, "pkexec-arguments"), os.path.join(scratch, "pkexec-input")))
        os.chmod(os.path.join(bin_dir, "pkexec"), 0o755)
        env["PATH"] = bin_dir + ":" + env.get("PATH", "/usr/bin:/bin")
        notifications = session.notification_server(env)
        if notifications is None:
            print("notifications not checked: dunst is not installed or did not start (scripts/setup installs it)")

        log = open(os.path.join(scratch, "app.log"), "wb")
        started = time.monotonic()
        app = session.start([arguments.app], env=env, stdout=log, stderr=subprocess.STDOUT)
        if arguments.real_agent:
            check_real_agent(Atspi, RealAgent(arguments.agent, arguments.real_agent, arguments.netns),
                             arguments.other_profile, display, arguments.screenshots)
            if app.poll() is not None:
                raise AssertionError("the app exited with status %d" % app.returncode)
            return 0

        # No profile and no agent: the Welcome screen.
        find(Atspi, lambda n: n.get_name() == "Welcome to Roam", within=20, what="the Welcome screen's title")
        print("start-up: the Welcome screen readable through AT-SPI %.2f s after the start" % (time.monotonic() - started))
        time.sleep(0.5)
        screenshot(display, os.path.join(arguments.screenshots, "welcome.png"))
        check_import(Atspi, scratch, arguments.agent, display, arguments.screenshots)

        # A profile and an agent that is connected: the Details screen reads what it reports.
        with open(os.path.join(profiles, "work.yaml"), "w") as profile:
            profile.write("# the app lists profiles by name only\n")
        agent = FakeAgent(env["ROAM_CONTROL_SOCKET"])
        state = find(Atspi, lambda n: n.get_description() == "Tunnel state" and n.get_name() == "Connected",
                     within=15, what='the state label reading "Connected"')
        toggle = find(Atspi, lambda n: n.get_name() == "Tunnel" and n.get_n_actions() > 0, what="the switch")
        if not toggle.get_state_set().contains(Atspi.StateType.CHECKED):
            raise AssertionError("the switch is off while the agent is connected")
        find(Atspi, lambda n: n.get_name() == "Round trip", what='the "Round trip" row')
        # The profiles are the agent's list (the directory holds only work.yaml), its own marked,
        # the other with a button that switches to it.
        find(Atspi, lambda n: n.get_name() == "In use" and n.get_parent() is not None and "work" in [
            n.get_parent().get_child_at_index(i).get_name() for i in range(n.get_parent().get_child_count())],
            what="the profile in use, work, marked")
        use_home = find(Atspi, lambda n: n.get_name() == "Use home" and n.get_n_actions() > 0, what='the "Use home" button')
        print("details: state label %r, switch found as a %s" % (state.get_name(), toggle.get_role_name()))
        time.sleep(0.5)
        screenshot(display, os.path.join(arguments.screenshots, "details.png"))

        # Switching profiles asks the agent for use-profile, naming the profile.
        use_home.do_action(0)
        wait_for(lambda: "use-profile home" in agent.received, 10, "Use home did not send use-profile home")
        find(Atspi, lambda n: n.get_name() == "Use work" and n.get_n_actions() > 0,
             what='the "Use work" button once home is in use')
        print("profiles: Use home sent use-profile home; then work was the one to switch to")
        agent.set(status("connected"))
        find(Atspi, lambda n: n.get_name() == "Use home" and n.get_n_actions() > 0, what='the "Use home" button again')

        # One instance per session: a second start hands over to the first and ends.
        second = session.start([arguments.app], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            second.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("a second roam-desktop kept running beside the first")
        if second.returncode != 0 or app.poll() is not None:
            raise AssertionError("a second start ended with %d, the first %s" % (
                second.returncode, "runs" if app.poll() is None else "ended"))

        # Flipping the switch asks the agent for `down`; the label follows the agent.
        toggle.do_action(0)
        deadline = time.monotonic() + 10
        while "down" not in agent.received and time.monotonic() < deadline:
            time.sleep(0.1)
        if "down" not in agent.received:
            raise AssertionError("the fake agent never received down (it received %s)" % agent.received)
        find(Atspi, lambda n: n.get_description() == "Tunnel state" and n.get_name() == "Off",
             what='the state label reading "Off" after down')
        time.sleep(0.5)
        screenshot(display, os.path.join(arguments.screenshots, "details-off.png"))

        # Behind a captive portal: the banner with its login button.
        agent.set(status("portal", portal={"url": "https://login.hotel.example/", "window_ms": None,
                                           "next_check_ms": 28000.0}))
        find(Atspi, lambda n: "needs a login before the tunnel can connect" in (n.get_name() or ""),
             what="the portal banner")
        find(Atspi, lambda n: n.get_name() == "Log in" and n.get_n_actions() > 0, what='the "Log in" button')
        find(Atspi, lambda n: n.get_name() == "wifi0, Wi-Fi \u201cHotel Lobby\u201d, from 10.31.1.2",
             what="the network's row with the Wi-Fi network's name")
        time.sleep(0.5)
        screenshot(display, os.path.join(arguments.screenshots, "portal.png"))

        if notifications:
            check_notifications(agent, env, display, scratch, arguments.screenshots)
        # The tray's watcher (Debian's) comes after the app, as a panel may: the item shows up then.
        if shutil.which("status-notifier-watcher") is None:
            raise AssertionError("no status-notifier-watcher (Debian's haskell-status-notifier-item-utils; scripts/setup installs it)")
        watcher = DebianWatcher(session, env)
        try:
            check_tray(watcher, agent)
        finally:
            watcher.stop()
        print("resident memory with the Details screen shown: %s" % resident(app.pid))
        if app.poll() is not None:
            raise AssertionError("the app exited with status %d" % app.returncode)
        print("received by the fake agent: " + " ".join(agent.received))
        return 0
    except Exception as failure:
        print("FAILED: %s" % failure, file=sys.stderr)
        for name in ("xvfb.log",):
            if os.path.exists(os.path.join(scratch, name)):
                with open(os.path.join(scratch, name), errors="replace") as log:
                    print("%s:\n%s" % (name, log.read()[-2000:]), file=sys.stderr)
        print("processes: %s" % [(p.args[0], p.poll()) for p in session.processes], file=sys.stderr)
        app_log = os.path.join(scratch, "app.log")
        if os.path.exists(app_log):
            with open(app_log, errors="replace") as log:
                print("the app said:\n" + log.read()[-4000:], file=sys.stderr)
        return 1
    finally:
        session.end()
        if agent is not None:
            agent.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
