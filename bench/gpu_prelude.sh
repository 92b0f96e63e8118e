# Sourced by the bench/gpu_*.sh scripts once they have set $log (after .gpu/install.sh): graphrt
# and the carried wheels installed, the GPU and the versions written to $log.
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
for whl in .gpu/*.whl .gpu/wheels/*.whl; do [ -f "$whl" ] && python3 -m pip install -q --no-deps "$whl" >/dev/null 2>&1; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
python3 -c "import torch, triton, sgl_kernel; print('torch', torch.__version__, 'triton', triton.__version__, 'sgl_kernel', sgl_kernel.__version__)" 2>&1 | tee -a "$log"
