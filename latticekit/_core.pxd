from libcpp.memory cimport unique_ptr

from latticekit._cpp cimport KatzState, KatzStateMemo, KatzSuccessors, Model, NGramCache


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
    cdef unique_ptr[KatzStateMemo] states  # the static model's states its searches visit
    cdef CoreKatzSuccessors states_of  # the index those states read, kept alive with them

    cdef const KatzSuccessors* _index(self, CoreKatzSuccessors successors)
