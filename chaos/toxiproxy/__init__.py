"""An embedded fault proxy that speaks the Toxiproxy HTTP API (see api.py) and
implements its toxics (toxics/) over real TCP (proxy.py), under trio."""

from chaos.toxiproxy.api import ToxiproxyServer, serve_toxiproxy
from chaos.toxiproxy.proxy import Proxy, Roll, default_roll

__all__ = ["Proxy", "Roll", "ToxiproxyServer", "default_roll", "serve_toxiproxy"]
