"""JAX devices: the default platform's devices plus the CPU devices.

Listing devices starts JAX's runtime (its backends), after which ``jax_num_cpu_devices``
and the memory variables no longer apply. ``runtime_started`` reads
``xla_bridge.backends_are_initialized``, a private function; if a JAX release drops it we
assume "not started" and let JAX's own error surface through ``configure``.
"""

from __future__ import annotations

import jax

from xdevice._configure import AppliesPendingConfiguration
from xdevice._device import Device, device_from_parts
from xdevice._errors import ConfigurationError, message
from xdevice._types import Applied, Config


class Devices(AppliesPendingConfiguration):  # creating the backend applies pending settings
    def version(self) -> str:
        return jax.__version__

    def runtime_started(self) -> bool:
        try:
            from jax._src import xla_bridge
        except ImportError:
            return False
        started = getattr(xla_bridge, "backends_are_initialized", None)
        return bool(started()) if started is not None else False

    def list_devices(self) -> list[Device]:
        native = list(jax.local_devices())  # this process's (under jax.distributed, not the others')
        if native[0].platform != "cpu":
            native += jax.local_devices(backend="cpu")
        return [
            self.device_from_native(d).with_facts(name=d.device_kind if d.platform != "cpu" else "") for d in native
        ]

    def native_device(self, device: Device) -> jax.Device:
        found = _native.get(device)
        if found is None:
            platform = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu"}[device.kind]
            found = _native[device] = jax.local_devices(backend=platform)[device.index]
        return found

    def device_from_native(self, native: jax.Device) -> Device:
        found = _named.get(native)
        if found is None:
            # numbered among this process's devices of its kind: under jax.distributed ids run
            # across processes (process 1's first CPU is id 2048, but cpu:0 here)
            local = jax.local_devices(backend=native.platform)
            found = device_from_parts(native.platform, local.index(native) if native in local else native.id, native)
            _named[native] = found
        return found

    def enable_float64(self) -> None:
        jax.config.update("jax_enable_x64", True)

    def configure_devices(self, config: Config) -> list[Applied]:
        if config.cpu_devices is None:
            return []
        try:
            jax.config.update("jax_num_cpu_devices", config.cpu_devices)
        except RuntimeError as error:
            raise ConfigurationError(
                message(
                    "JAX already started, so cpu_devices cannot change",
                    received=str(error),
                    fix="call xdevice.configure(...) before the first JAX computation",
                )
            ) from error
        return [
            Applied("jax", "cpu_devices", config.cpu_devices, "applied", f"jax_num_cpu_devices={config.cpu_devices}")
        ]


# both directions, remembered (a process's devices are fixed once JAX has started, which
# listing them does): device_of and to_device are hot calls
_native: dict[Device, jax.Device] = {}
_named: dict[jax.Device, Device] = {}
