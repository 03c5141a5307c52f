from libcpp.memory cimport unique_ptr

from latticekit._cpp cimport KatzState, KatzSuccessors, Model, NGramCache


cdef class CoreModel:
    cdef unique_ptr[Model] model


cdef class CoreKatzSuccessors:
    cdef unique_ptr[KatzSuccessors] index
    cdef CoreModel model  # the model the index reads, kept alive with it


cdef class CoreKatzState:
    cdef unique_ptr[KatzState] state
    cdef CoreKatzSuccessors successors  # the index the state reads, kept alive with it


cdef class CoreNGramCache:
    cdef unique_ptr[NGramCache] cache
