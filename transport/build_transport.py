import os
from cffi import FFI
here = os.path.dirname(os.path.abspath(__file__))
ffibuilder = FFI()
ffibuilder.cdef(open(os.path.join(here, "cxlkv_transport.h")).read())
ffibuilder.set_source("cxlkv.transport._transport", '#include "cxlkv_transport.h"\nint cxlkv_probe(void){return 42;}', include_dirs=[here])
