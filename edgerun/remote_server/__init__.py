"""The remote device's server (`edgerun serve`): runs programs for remote clients on this device's backends.

It sits above the runtime (it loads and runs programs), while the wire protocol and the client it speaks
with (`edgerun.remote`) sit below the backends, so the remote backend can use them.
"""
