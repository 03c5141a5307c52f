from libcpp.memory cimport unique_ptr

from latticekit._cpp cimport Model


cdef class CoreModel:
    cdef unique_ptr[Model] model
