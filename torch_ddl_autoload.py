"""Makes backend="ddl" work without `import torch_ddl`.

torch calls register() while it is imported (the "torch.backends" entry point group; turned off
with TORCH_DEVICE_BACKEND_AUTOLOAD=0). It only names the backend: torch_ddl and its extension
are loaded when a 'ddl' group is first created, so importing torch costs no more than this
module.
"""


def _create_backend(*args, **kwargs):
    import torch_ddl

    return torch_ddl._create_backend(*args, **kwargs)


def register():
    import torch.distributed as dist

    if not dist.is_available() or "ddl" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("ddl", _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
